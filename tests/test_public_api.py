"""The public names of ``sdot``: exported, documented, and nothing forgotten."""
import inspect

import sdot


def test_all_names_exist_and_are_documented():
    assert len(set(sdot.__all__)) == len(sdot.__all__)
    for name in sdot.__all__:
        obj = getattr(sdot, name)  # AttributeError if missing
        assert inspect.getdoc(obj), f"sdot.{name} has no docstring"


def test_public_classes_and_functions_are_in_all():
    defined_here = [
        name for name, obj in vars(sdot).items()
        if not name.startswith("_") and (inspect.isclass(obj) or inspect.isfunction(obj))
        and getattr(obj, "__module__", "").split(".")[0] == "sdot"
    ]
    missing = sorted(set(defined_here) - set(sdot.__all__))
    assert not missing, f"public but not in sdot.__all__: {missing}"
