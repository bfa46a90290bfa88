"""Wire fidelity: an Echo 2.0 exchange captured by tshark, decoded by Wireshark's Aeron dissector.

``python -m tests.wire.capture`` runs it by hand; ``tests/wire/test_wire.py`` runs it under pytest.
"""
