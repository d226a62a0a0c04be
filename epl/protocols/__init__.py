"""Protocols that units on every floor implement and the rewrite core drives.

* :mod:`epl.protocols.passes`: the rewrite-pass interface, phases, communicator purposes;
* :mod:`epl.protocols.hooks`: the reversible registry of TensorFlow patches.

They import nothing from EPL, so a saver or a split layer can define a pass or a patch
without importing :mod:`epl.parallel` (docs/design.md, "Floors").
"""
