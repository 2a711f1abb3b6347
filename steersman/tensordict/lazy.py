# placeholder: being written
class LazyStackedTensorDict:  # noqa
    _is_lazy = True
def lazy_stack(*a, **k):
    raise RuntimeError("lazy_stack: under construction")
def lazy_cat(*a, **k):
    raise RuntimeError("lazy_cat: under construction")
