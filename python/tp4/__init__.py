"""tp4: the four-Spark TP4 production line.

The package is laid out by the stages a line goes through, each a subpackage that imports only
its own stage and the ones before it (tests/test_layers.py holds every module to that):

- ``tp4.core``: what every stage uses (errors, state paths, the one subprocess funnel, secrets);
- ``tp4.line``: the line's description (profile, adapter registry, knob table, plan);
- ``tp4.image``: the image (pinned sources, Nix, OCI assembly, build, image store, distribution);
- ``tp4.hosts``: the hosts (node handles, doctor, NFS share, offline pack, checkpoint download,
  NixOS deploy, host keys);
- ``tp4.serving``: the running line (serve, boot log, OpenAI API client, fleet and router);
- ``tp4.measuring``: what the line delivers (bench, report, charts, needle, qeval);
- ``tp4.cli``: the commands over all of them.
"""

__version__ = "0.1.0"

# the stages, first to last (a module imports only its own stage and earlier ones)
STAGES = ("core", "line", "image", "hosts", "serving", "measuring", "cli")
