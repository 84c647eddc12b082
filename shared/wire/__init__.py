"""The wire layer under every message between the parties, bottom to top.

    arrays.py       float arrays as little-endian bins with a dtype tag; finiteness
    reader.py       CodecError, DecodeLimits and Fields: bounded msgpack parsing and typed,
                    checked reads of one map's fields (any failure is a CodecError)
    envelope.py     one msgpack map with the wire version "v" and a type tag "t", for every
                    message type of the protocol (MessageType), PSI included
    activations.py  activation chunks (product-quantized or raw) to and from the wire
    messages.py     the message classes, checked on construction

``shared.codec`` (training messages) and ``shared.psi`` (PSI messages) hold the
``encode_*`` / ``decode_*`` pairs on top of these. docs/PROTOCOL.md describes the bytes.
"""
