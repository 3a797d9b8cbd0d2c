"""gpufleet's policy pack: the guard rails every environment's stack is checked against.

`policies/__main__.py` is the pack Pulumi runs (`pulumi preview --policy-pack policies`);
the rule logic lives in `gpufleet.policies.rules`, importable and testable without the engine.
"""
