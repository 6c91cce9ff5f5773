"""What SageMaker's jobs and endpoints offline share: the account (region, id, instance quotas), one
lock over both (a quota check counts every running job and endpoint), and their background threads."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime

from d2ops.offline.quotas import AccountQuotas
from d2ops_core.platform import QuotaUsage

# (instance type, quota usage, instances): what a job or an endpoint holds against the account's quotas.
Fleet = tuple[str, QuotaUsage, float]


def utc_now() -> datetime:
    return datetime.now(UTC)


class SageMakerAccount:
    def __init__(self, region: str, account_id: str, quotas: AccountQuotas | None = None) -> None:
        self.region = region
        self.account_id = account_id
        # The account's instance quotas: a create over one is refused with ResourceLimitExceeded.
        self.quotas = quotas if quotas is not None else AccountQuotas()
        self.lock = threading.RLock()
        self.closing = threading.Event()  # set at shutdown: a bake in progress ends
        self._threads: list[threading.Thread] = []
        self._holders: list[Callable[[], list[Fleet]]] = []

    def arn(self, kind: str, name: str) -> str:
        return f"arn:aws:sagemaker:{self.region}:{self.account_id}:{kind}/{name.lower()}"

    def start(self, name: str, target: Callable[[], None]) -> None:
        """Run ``target`` in the background (a job, an endpoint coming up or updating)."""
        thread = threading.Thread(target=target, name=f"sagemaker-{name}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def join(self, timeout: float) -> None:
        for thread in self._threads:
            thread.join(timeout=timeout)

    def holds(self, fleets: Callable[[], list[Fleet]]) -> None:
        """Count what ``fleets()`` answers (instances running now) against the quotas."""
        self._holders.append(fleets)

    def check_quotas(self, wanted: list[Fleet]) -> None:
        """Refuse (ResourceLimitExceeded) a request whose instances would exceed a quota. Call under the lock."""
        in_use = [fleet for fleets in self._holders for fleet in fleets()]
        for instance_type in sorted({t for t, _, _ in wanted}):
            for usage in sorted({u for t, u, _ in wanted if t == instance_type}):
                requested = sum(n for t, u, n in wanted if (t, u) == (instance_type, usage))
                used = sum(n for t, u, n in in_use if (t, u) == (instance_type, usage))
                self.quotas.check(instance_type, usage, requested, used)
