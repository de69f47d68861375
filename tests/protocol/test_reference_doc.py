"""docs/protocol.md is the reference rendered from the declarations: it lists every
message and error code, and is current."""

from pathlib import Path

from shoal.protocol.errors import CODES
from shoal.protocol.messages import MESSAGES
from shoal.protocol.reference import render

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"


def test_the_protocol_doc_is_current():
    text = render()
    assert all(f"### {name}\n" in text for name in MESSAGES)
    assert all(f"| `{code}` |" in text for code in CODES)
    assert DOC.read_text() == text, "docs/protocol.md is stale: python -m shoal.protocol.reference > docs/protocol.md"
