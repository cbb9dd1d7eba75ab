"""`orkpack build`: source checkpoint -> placement -> codecs/layout -> pack writer, one stage a module.

1. :mod:`.options`: the options, and the checks that refuse contradicting ones;
2. :mod:`.inputs`: the source opened, its tensors listed, an output that is one of the inputs refused;
3. :mod:`.placement`: where and how each slice goes (a tier map solved, given or a cluster node's; rules;
   the untied head), one interface;
4. :mod:`.encode`: each tensor as read: smoothed, split into experts, placed, clipped, encoded;
5. :mod:`.write`: read-ahead, the pack writer's buffers and thread, the provenance;

and :func:`build` (:mod:`.pipeline`) runs them in that order. :mod:`.cluster` builds one pack per board of a
cluster plan through the same function.
"""
from .options import BuildOptions
from .pipeline import BuildResult, build
from .placement import Decision, RulePlacement, TierMapPlacement, raw_decision

__all__ = ["BuildOptions", "BuildResult", "Decision", "RulePlacement", "TierMapPlacement", "build", "raw_decision"]
