"""Child process states, named as in supervisord, and the groups the supervisor reasons with."""

# Import-free on purpose (like supervisor/states.py): anything may import it, including
# status renderers that must not pull in the process machinery.


class ProcessStates:
    STOPPED = "STOPPED"  # not running and not supposed to run until started
    STARTING = "STARTING"  # spawned, not yet up for startsecs (and not yet ready)
    RUNNING = "RUNNING"  # up for startsecs and ready: the start counted as a success
    BACKOFF = "BACKOFF"  # died while STARTING (a fast failure); waits, then retries
    STOPPING = "STOPPING"  # stop signal sent; SIGKILL to the group when stop_timeout passes
    EXITED = "EXITED"  # died after reaching RUNNING; waits its backoff, then restarts
    FATAL = "FATAL"  # too many fast failures in a row; stays down until reset()
    # Stopped on purpose because its work is idle (a watcher whose client wrote nothing for
    # a while); started again by start() on demand. Not a failure: no backoff, no retries.
    IDLE = "IDLE"


ALL_STATES = frozenset(
    (
        ProcessStates.STOPPED,
        ProcessStates.STARTING,
        ProcessStates.RUNNING,
        ProcessStates.BACKOFF,
        ProcessStates.STOPPING,
        ProcessStates.EXITED,
        ProcessStates.FATAL,
        ProcessStates.IDLE,
    )
)

# Supposed to be running (supervisord's RUNNING_STATES).
RUNNING_STATES = frozenset((ProcessStates.STARTING, ProcessStates.RUNNING, ProcessStates.BACKOFF))

# No process exists (supervisord's STOPPED_STATES).
STOPPED_STATES = frozenset(
    (ProcessStates.STOPPED, ProcessStates.EXITED, ProcessStates.FATAL, ProcessStates.IDLE)
)

# A live process exists that signals can reach.
SIGNALLABLE_STATES = frozenset(
    (ProcessStates.STARTING, ProcessStates.RUNNING, ProcessStates.STOPPING)
)

# Waiting for the next start time after a failure.
WAITING_STATES = frozenset((ProcessStates.BACKOFF, ProcessStates.EXITED))

# Nothing will happen until someone calls start() or reset(): what a stop waits for.
IDLE_STATES = frozenset((ProcessStates.STOPPED, ProcessStates.FATAL, ProcessStates.IDLE))
