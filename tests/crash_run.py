"""Test-only: run the objbench command line with every training run hard-crashing right after it logs a step.

    OBJBENCH_TEST_CRASH_AT_STEP=5 python tests/crash_run.py train ...     # like `objbench train ...`
    OBJBENCH_TEST_CRASH_AT_STEP=3 python tests/crash_run.py sweep ...     # every sweep worker crashes alike
    OBJBENCH_TEST_KILL_IN_SAVE=renamed:3 python tests/crash_run.py train ...  # killed inside step 3's checkpoint save

The crash is ``os._exit(3)`` from ``train``'s ``after_step`` callback: no ``finally`` block runs, as after a kill.
Sweep workers are spawned processes that import this file again as their main module, so the callback is
installed in each of them too. Production code reads no crash setting: the callback is the loop's only hook.
"""

import functools
import os
import sys

CRASH_AT_STEP = int(os.environ.get("OBJBENCH_TEST_CRASH_AT_STEP", "0"))
KILL_IN_SAVE = os.environ.get("OBJBENCH_TEST_KILL_IN_SAVE", "")  # "<save point>:<step>": os._exit(9) there


def _crash_after(step: int) -> None:
    if step == CRASH_AT_STEP:
        os._exit(3)


def install() -> None:
    """Make every ``objbench.experiments.run.train.train`` call of this process crash after step CRASH_AT_STEP."""
    import objbench.experiments.run.train as loop

    original = loop.train

    @functools.wraps(original)
    def train(cfg, **kwargs):
        kwargs.setdefault("after_step", _crash_after)
        return original(cfg, **kwargs)

    loop.train = train


def install_save_kill() -> None:
    """Make the checkpoint save of step N exit the process at the named point (checkpoint.SAVE_POINTS)."""
    import objbench.experiments.run.checkpoint as checkpoint

    point, step = KILL_IN_SAVE.split(":")

    def kill(at: str, at_step: int) -> None:
        if at == point and at_step == int(step):
            os._exit(9)

    checkpoint.SAVE_HOOK = kill


if CRASH_AT_STEP:
    install()
if KILL_IN_SAVE:
    install_save_kill()

if __name__ == "__main__":
    from objbench.experiments.cli.main import main

    sys.exit(main(sys.argv[1:]))
