"""The examples as a package, so that tests import the modules the examples share
(``from examples import serving_deployment``); every other file here is a program run by
``stratacl-launch`` (or ``python``), which never imports this file."""
