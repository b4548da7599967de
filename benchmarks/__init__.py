"""The benchmarks as a package: tests import the harnesses and readers they check
(``from benchmarks import soak, paper``) with the repository's root on the path (pytest's
``pythonpath``), not by editing ``sys.path`` themselves.

Each file is also a script (``python benchmarks/NAME.py``), and scripts import their siblings
and the examples' shared modules by name (``import e2e``, ``import serving_deployment``). A
script finds its siblings because Python puts its folder first on the path; importing the
package puts the same two folders there, so those imports resolve either way."""
import os as _os
import sys as _sys

_HERE = _os.path.dirname(_os.path.abspath(__file__))
for _folder in (_os.path.join(_os.path.dirname(_HERE), "examples"), _HERE):
    if _folder not in _sys.path:
        _sys.path.insert(0, _folder)
