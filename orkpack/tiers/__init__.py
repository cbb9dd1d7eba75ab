"""The tier-map compiler: board profiles, runtime paths, weightless manifests, hotness profiles, the exact solver, `orkpack plan`.

docs/TIERMAP.md documents the schemas and the objective. Entry points:
``board.load_board`` (a board joined with ``runtime.load_runtime``), ``manifest.manifest_from_path``, ``profile.load_profile``,
``solver.solve``, ``tiermap.TierMap``, ``command.plan`` / ``command.plan_command``.
"""
