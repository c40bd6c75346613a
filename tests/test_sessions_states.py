"""Session states change only along the transition table (memd.sessions.states)."""

from __future__ import annotations

import pytest

from memd.sessions import SessionState
from memd.sessions.states import ALLOWED, SessionStateError, check_transition
from memd.sessions.store import Session

S = SessionState


def test_the_table_names_every_state_and_only_these_moves() -> None:
    assert set(ALLOWED) == set(S)
    moves = {(old, new) for old, targets in ALLOWED.items() for new in targets}
    assert moves == {
        (S.ACTIVE, S.ENDED),
        (S.ENDED, S.ACTIVE),
        (S.ENDED, S.COMPACTED),
        (S.COMPACTED, S.ACTIVE),
        (S.COMPACTED, S.ENDED),
    }


def test_a_move_the_table_refuses_raises_and_changes_nothing() -> None:
    sess = Session("2027-01-15T08-00-00Z-0000", "active", 0.0, 0.0)
    assert sess.state is S.ACTIVE  # a row read back holds the plain value
    with pytest.raises(SessionStateError, match="active -> compacted"):
        sess.move(S.COMPACTED)
    assert sess.state is S.ACTIVE
    assert sess.move(S.ENDED) is S.ACTIVE and sess.state is S.ENDED
    with pytest.raises(SessionStateError):
        check_transition(sess.session_id, S.ACTIVE, S.ACTIVE)
