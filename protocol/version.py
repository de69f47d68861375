"""The wire protocol's version.

Evolution rule: within a major version, message fields and blobs are only ever added,
optional and with defaults; never reordered, renamed, retyped or removed. A receiver
ignores fields it does not know from a newer minor version and refuses another major
version with an `Error` reply. Anything else is a new major version.
"""

PROTOCOL_MAJOR = 1
PROTOCOL_MINOR = 10
PROTOCOL_VERSION = (PROTOCOL_MAJOR, PROTOCOL_MINOR)
