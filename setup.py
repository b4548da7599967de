"""Build hook: package discovery and the native modules; the rest is declared in pyproject.toml.

Packages are found, not listed, so a new folder under ``stratacl/`` or ``launcher/`` ships without
anyone remembering to add it (tests/test_packaging.py checks the wheel against the tree). The
``launcher/`` folder installs as ``stratacl_launcher``, so the project squats no generic name.
"""
import numpy
from setuptools import Extension, find_packages, setup

LAUNCHER = "stratacl_launcher"

packages = find_packages(include=["stratacl", "stratacl.*"])
packages += [LAUNCHER + name[len("launcher"):] for name in find_packages(include=["launcher", "launcher.*"])]

setup(
    packages=packages,
    package_dir={LAUNCHER: "launcher"},
    ext_modules=[
        Extension(
            "stratacl.runtime._native",
            sources=["stratacl/runtime/_module.c", "stratacl/runtime/_native.c", "stratacl/runtime/_waits.c",
                     "stratacl/runtime/_flightrec.c", "stratacl/runtime/_agree.c", "stratacl/runtime/_p2pcall.c",
                     "stratacl/runtime/_meshcall.c", "stratacl/runtime/_maps.c", "stratacl/runtime/_replay.c"],
            depends=["stratacl/runtime/_native.h", "stratacl/collectives/_kernels.h"],
            # _replay.c reads numpy's array struct (its header only: no numpy C API table)
            include_dirs=[numpy.get_include()],
            # the functions the sources share stay out of the module's exported symbols
            extra_compile_args=["-O2", "-fvisibility=hidden"],
        ),
        Extension(
            "stratacl.collectives._kernels",
            sources=["stratacl/collectives/_kernels.c"],
            depends=["stratacl/collectives/_kernels.h"],
            # no fused multiply-add: every element must round exactly as numpy rounds it
            extra_compile_args=["-O3", "-ffp-contract=off"],
        ),
        Extension(
            "stratacl.collectives._eproute",
            sources=["stratacl/collectives/_eproute.c"],
            extra_compile_args=["-O2"],
        ),
        Extension(
            "stratacl.ub._fill",
            sources=["stratacl/ub/_fill.c"],
            # no fused multiply-add: the rates must round as the numpy formulation's
            extra_compile_args=["-O2", "-ffp-contract=off"],
        ),
        Extension(
            "stratacl.collectives._lpt",
            sources=["stratacl/collectives/_lpt.c"],
            extra_compile_args=["-O2"],
        ),
    ]
)
