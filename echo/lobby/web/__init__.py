"""The lobby's WebSocket door: the JSON protocol (`jsonwire`, pure; its JSON Schema in
``schema.json``) and the trio driver that serves it beside the UDP members (`door`)."""
