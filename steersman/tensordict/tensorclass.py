# placeholder: being written
def tensorclass(cls=None, **kw):
    raise RuntimeError("under construction")
def is_tensorclass(obj):
    return False
def from_dataclass(*a, **k):
    raise RuntimeError("under construction")
