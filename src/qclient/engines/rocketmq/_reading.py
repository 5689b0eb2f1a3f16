"""Callers reading their own answers: ``Connection(read_by_callers=True)`` (leader/follower).

One caller at a time holds the *reading turn* (``conn._reading``, under ``conn._rlock``):
it polls the socket, dispatches every answer it decodes to its slot (its own included)
and, once its own answer is in (or its time is up), hands the turn to the oldest caller
still waiting, by setting that slot's ``turn`` and releasing its lock, or gives it up
when none waits. The oldest, because a ``call_many`` caller waits on its slots in order:
its oldest unanswered slot is the one it is waiting on.

Every release of a slot's lock happens once: an answer pops the slot from ``pending``
first (as ``_fail`` does, under ``_rlock``, skipping a slot handed the turn), and only
the caller holding the turn dispatches answers. Once the connection failed, the caller
holding the turn (or ``close``, when none holds it) closes the descriptor and keeps the
turn for good, so nothing reads a descriptor number the process may have reused.
"""

from __future__ import annotations

from time import monotonic
from typing import TYPE_CHECKING

from .remoting import RemotingCommand, RemotingProtocolError

if TYPE_CHECKING:
    from .connection import Connection, RemotingError, _Slot

__all__ = ["close_unread", "drain_idle", "end_turn", "pass_turn", "wait"]

#: how many reads an idle check takes at most (a peer streaming requests to an idle
#: connection must not hold up the caller that checks it)
_IDLE_READS = 8


def wait(
    conn: Connection, slot: _Slot, op: int, code: int, deadline: float, timeout: float
) -> RemotingCommand | RemotingError:
    """The answer in ``slot``, or the error for it, reading the socket when it is this
    caller's turn."""
    with conn._rlock:
        mine = not conn._reading
        if mine:
            conn._reading = True
    if not mine:
        if slot.lock.acquire(True, max(deadline - monotonic(), 0.0)):
            if not slot.turn:
                return conn._answer(slot)
            slot.turn = False  # the caller reading left: this one reads now
        else:
            with conn._rlock:
                if slot.turn:  # handed the turn as the wait ended: pass it on
                    slot.turn = False
                    conn._pending.pop(op, None)
                    if not pass_turn(conn):
                        conn._reading = False
                    return conn._timed_out(code, timeout)
                if conn._pending.pop(op, None) is not None:
                    return conn._timed_out(code, timeout)
            slot.lock.acquire()  # answered (or failed) as the wait ended: a moment away
            return conn._answer(slot)
    return _read_turn(conn, slot, op, code, deadline, timeout)


def _read_turn(
    conn: Connection, slot: _Slot, op: int, code: int, deadline: float, timeout: float
) -> RemotingCommand | RemotingError:
    """Read until ``slot`` is answered or its deadline passes, then end the turn."""
    poll = conn._poller.poll
    recv_into = conn._sock.recv_into
    buf, view, dispatch = conn._buf, conn._view, conn._dispatch
    timed_out = False
    try:
        while slot.result is None and not conn._closed:
            now = monotonic()
            left = deadline - now
            if left <= 0:
                timed_out = conn._pending.pop(op, None) is not None
                break
            if not poll(left * 1000.0):
                continue
            conn._read_at = now
            n = recv_into(buf)
            if not n:
                conn._fail(conn._eof())
                break
            dispatch(view[:n])
    except (OSError, RemotingProtocolError) as exc:
        conn._fail(conn._read_error(exc))
    except BaseException as exc:  # interrupted mid-read: the stream may be cut mid-frame
        conn._fail(conn._read_error(exc))
        end_turn(conn)
        raise
    end_turn(conn)
    if timed_out:
        return conn._timed_out(code, timeout)
    return conn._answer(slot)


def end_turn(conn: Connection) -> None:
    """Hand the reading turn to the oldest waiting caller, or give it up; on a failed
    connection keep it and close the descriptor."""
    with conn._rlock:
        if not conn._closed:
            if not pass_turn(conn):
                conn._reading = False
            return
    conn._close_socket()


def pass_turn(conn: Connection) -> bool:
    """With ``_rlock`` held: hand the turn to the oldest pending slot, if any."""
    for slot in list(conn._pending.values()):
        slot.turn = True
        slot.lock.release()
        return True
    return False


def close_unread(conn: Connection) -> None:
    """After ``_fail``: close the descriptor unless a caller holds the turn (it will)."""
    with conn._rlock:
        if conn._reading:
            return
        conn._reading = True
    conn._close_socket()


def drain_idle(conn: Connection) -> None:
    """Read what a peer sent to a connection no caller is reading: its close (the
    connection fails now, not on the next request) and server requests."""
    with conn._rlock:
        if conn._reading or conn._closed:
            return
        conn._reading = True
    try:
        for _ in range(_IDLE_READS):
            if not conn._poller.poll(0):
                break
            n = conn._sock.recv_into(conn._buf)
            if not n:
                conn._fail(conn._eof())
                break
            conn._dispatch(conn._view[:n])
        conn._read_at = monotonic()
    except (OSError, RemotingProtocolError) as exc:
        conn._fail(conn._read_error(exc))
    end_turn(conn)
