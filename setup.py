"""Build hook for the one native module; everything else is declared in pyproject.toml."""
from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "stratacl.runtime._native",
            sources=["stratacl/runtime/_native.c"],
            extra_compile_args=["-O2"],
        )
    ]
)
