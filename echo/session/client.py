async def connect(*a, **k): raise NotImplementedError
