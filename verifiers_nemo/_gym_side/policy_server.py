"""Placeholder process for the ``policy_model`` server entry of a verifiers_nemo Gym stack.

nemo-gym's launcher needs a process for every server entry. The policy's real host and port in
the Gym config belong to verifiers_nemo's routing proxy in the owning process, so Gym agents call
the proxy directly; this process only holds the entry's place until the stack stops.
"""

import signal
import sys

if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while True:
            signal.pause()
    except KeyboardInterrupt:
        pass
