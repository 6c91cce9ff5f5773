"""docs/interfaces.md is generated from the documents' pydantic models and must not go stale."""

from __future__ import annotations

from d2ops.interfaces_doc import DOC_PATH, DOCUMENTS, model_for, render


def test_interfaces_doc_is_up_to_date() -> None:
    assert DOC_PATH.read_text() == render(), (
        "docs/interfaces.md is stale: a document's model changed. Regenerate it with "
        "`.venv/bin/python -m d2ops.interfaces_doc --write` and commit the result.")


def test_every_document_names_an_importable_model_once() -> None:
    assert len({d.anchor for d in DOCUMENTS}) == len({d.model for d in DOCUMENTS}) == len(DOCUMENTS)
    for document in DOCUMENTS:
        assert model_for(document).model_json_schema()["properties"], document.model
