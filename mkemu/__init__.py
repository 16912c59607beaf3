"""mkemu: a cycle-approximate emulator of TPU-like accelerator chips and the .mk kernel language.

The Python API (docs/api.md) is this one import:

    import mkemu
    kernel = mkemu.compile("vector_add", hw="test", mesh="1x1x1")
    run = kernel(a=a, b=b)

Names are loaded on first use, so `import mkemu` (and the `mkemu` command) stays
quick until a program is compiled.
"""

__version__ = "0.1.0"

_LAZY = {
    "ConfigError": "mkemu.errors", "MkemuError": "mkemu.errors",
    "compile": "mkemu.api", "compile_source": "mkemu.api", "Kernel": "mkemu.api", "Run": "mkemu.api",
    "Report": "mkemu.api", "BufferInfo": "mkemu.api", "Options": "mkemu.options",
    "Session": "mkemu.session", "MachineInfo": "mkemu.session", "atomic_write": "mkemu.runner",
    "list_programs": "mkemu.shipped",
}
__all__ = list(_LAZY)


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mkemu' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    """The API's names too (loaded on first use): `dir(mkemu)`, tab completion and
    `help(mkemu)` see them."""
    return sorted({*globals(), *_LAZY})
