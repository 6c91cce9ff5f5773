"""Who may decide a review: a session of the stack's reviewer role, told apart by its IAM ARN.

A role signs nothing itself: whoever assumes it signs as ``arn:<partition>:sts::<account>:assumed-role/
<role name>/<session name>``, which is what API Gateway's IAM authorizer reports as the caller. The
status API (``POST /runs/{runId}/decision``) and ``d2ops approve/reject --stack`` (which assumes the role
for a caller who is not yet in it) compare with the same function. The session name is the caller's
choice when assuming the role; CloudTrail's AssumeRole event ties it to the principal who did.
Standard library only (the Lambda layer).
"""

from __future__ import annotations

import re

ROLE_ARN = re.compile(r"^arn:(?P<partition>aws[a-z-]*):iam::(?P<account>\d{12}):role/(?:[^/]+/)*"
                      r"(?P<name>[\w+=,.@-]{1,64})$")
SESSION_ARN = re.compile(r"^arn:(?P<partition>aws[a-z-]*):sts::(?P<account>\d{12}):assumed-role/"
                         r"(?P<name>[\w+=,.@-]{1,64})/(?P<session>[\w+=,.@-]{2,64})$")
# Any IAM or STS principal ARN; its last path part names the principal (a user, a role session, root).
_PRINCIPAL_ARN = re.compile(r"^arn:[a-z-]+:(?:iam|sts)::\d{12}:(?P<resource>.+)$")


def is_session_of(caller_arn: str, role_arn: str) -> bool:
    """Whether ``caller_arn`` is a session of the role ``role_arn``: same partition, account and role name (a
    session's ARN names the role without its path)."""
    role, session = ROLE_ARN.match(role_arn), SESSION_ARN.match(caller_arn)
    return bool(role and session and (role["partition"], role["account"], role["name"])
                == (session["partition"], session["account"], session["name"]))


def session_name_for(caller_arn: str) -> str:
    """A role session name that says who assumed the role: the caller's own name (an IAM user's, or the session
    name of the role it is in), in AssumeRole's alphabet (2-64 of ``[\\w+=,.@-]``)."""
    found = _PRINCIPAL_ARN.match(caller_arn)
    name = found["resource"].rsplit("/", 1)[-1] if found else ""
    name = re.sub(r"[^\w+=,.@-]", "-", name, flags=re.ASCII)[:64]
    return name if len(name) >= 2 else "d2ops-reviewer"
