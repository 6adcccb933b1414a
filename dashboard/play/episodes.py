"""The Play tab's open episodes and running steps, bounded in all and per client.

Anyone may play, and an episode holds database connections and its last QUERY result, so the app keeps every
visitor's environment in one `PlayEpisodes` (a page's `gr.State` holds only a handle): at most
`SQLENV_PLAY_MAX_EPISODES` open, at most `MAX_EPISODES_PER_CLIENT` of them one client's, each closed after
`SQLENV_PLAY_IDLE_S` seconds without a step. A client is `AccessPolicy.client` (its address behind the trusted
proxies, an IPv6 one as its /64).

No one's opening closes an episode played within its idle window: only its own page's New episode replaces it.
When there is no room the newcomer is refused (`PlayFull`, saying when a place frees at the latest). 16 anonymous
"New episode" calls in 2 s once closed an honest visitor's episode (issue 43), and then, with one episode each
from 16 addresses, the least recently played of all went: the visitor still reading the question (issue 49). What
a few addresses can hold together is bounded too: a client's second and later episodes are opened only while
fewer than half the places are taken (`shared_room`), so it takes at least half as many addresses as places, plus
a few, to fill Play.

`ClientSlots` bounds the Play events one client runs at once (`STEPS_PER_CLIENT`); Play's events have no shared
concurrency limit beside it (only Gradio's worker threads, 40). With the one limit of 4 that every event had, 8
visitors running 5 s queries made an honest step wait 7.8 s; now each client waits only for its own.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from dashboard.core.formatting import duration_words
from sqlenv.sandbox.native_memory import fix_mmap_threshold, malloc_trim

MAX_EPISODES_ENV = "SQLENV_PLAY_MAX_EPISODES"
IDLE_ENV = "SQLENV_PLAY_IDLE_S"
# Each open episode holds its database connections and its last QUERY result (up to the sandbox's
# max_result_bytes, 32 MB), and any visitor may open one: these bound how many and how long an abandoned one lives.
MAX_EPISODES = 16
IDLE_S = 600.0
#: Episodes one client may hold open: a person plays one per page, a household or an office behind one address a
#: few (and those beyond its first only while fewer than half the places are taken: `PlayEpisodes.shared_room`).
MAX_EPISODES_PER_CLIENT = 4
#: Play events (New episode, Step) one client may run at once; one more is refused at once, not queued, so a
#: client's slow queries hold no worker that another client's step would wait for.
STEPS_PER_CLIENT = 2


def limits_from_env(env: Mapping[str, str] | None = None) -> tuple[int, float]:
    """(most open episodes, idle seconds) from `SQLENV_PLAY_MAX_EPISODES` / `SQLENV_PLAY_IDLE_S` (default 16, 600);
    a malformed value raises ValueError naming the variable."""
    env = os.environ if env is None else env
    text = (env.get(MAX_EPISODES_ENV) or str(MAX_EPISODES)).strip()
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{MAX_EPISODES_ENV} must be a whole number >= 1, got {text!r}")
    idle_text = (env.get(IDLE_ENV) or str(IDLE_S)).strip()
    try:
        idle = float(idle_text)
    except ValueError:
        idle = -1.0
    if not 0 < idle < float("inf"):
        raise ValueError(f"{IDLE_ENV} must be a positive number of seconds, got {idle_text!r}")
    return int(text), idle


def close_env(env: Any) -> None:
    try:
        env.close()
    except Exception:  # closing a broken environment must not fail the visitor's event
        pass


# Episodes step on Gradio's worker threads, and glibc keeps what a thread's arena freed: without a trim a
# closed episode's result stays in the app's RSS (measured: 8 episodes of 30 MB results, 243 -> 515 MB, and
# still 515 MB after all of them closed).
_TRIM = malloc_trim()


@dataclass
class Episode:
    """One visitor's open environment in `PlayEpisodes`."""

    env: Any
    key: tuple  # (dataset, split, budget, questions mtime): a new episode on the same key reuses `env`
    session: str | None  # the Gradio session that opened it (closed with its page)
    client: str  # who opened it (`AccessPolicy.client`): the per-client bound and eviction count by it
    used: float  # the clock at its last open or step
    busy: bool = False  # a step is running on it
    closed: bool = False  # dropped while busy: the step closes it when it ends


class EpisodeBusy(Exception):
    """A step of this episode is still running."""


class PlayFull(Exception):
    """No room for one more episode of this client; the message says why and when a place frees at the latest."""


class PlayEpisodes:
    """The Play environments the app keeps open, bounded in number, per client and in idle time.

    Args:
        capacity: most episodes open at once (default `MAX_EPISODES`). One more is refused (`PlayFull`): an episode
            is closed only when idle for `idle_s`, when its page goes or asks for a new one, never for another
            client's.
        idle_s: an episode with no step for this long is closed by `sweep` (which every `open` runs, and Gradio
            runs through the state's delete callback once the page's state has been idle as long).
        per_client: most episodes one client holds (default `MAX_EPISODES_PER_CLIENT`); those beyond its first
            only while fewer than `shared_room` are open.
        clock: seconds, monotonic (default `time.monotonic`).

    A closed episode drops its environment (connections closed, its last result freed); its visitor's next step
    is told to start a new episode. One step at a time per episode: a second one while the first runs is refused
    (`EpisodeBusy`), and an episode dropped while a step runs is closed when that step ends.
    """

    def __init__(self, capacity: int = MAX_EPISODES, idle_s: float = IDLE_S,
                 per_client: int = MAX_EPISODES_PER_CLIENT, clock: Callable[[], float] = time.monotonic):
        if capacity < 1 or idle_s <= 0 or per_client < 1:
            raise ValueError(f"PlayEpisodes needs capacity >= 1, idle_s > 0 and per_client >= 1, got {capacity}, "
                             f"{idle_s}, {per_client}")
        self.capacity, self.idle_s, self.per_client, self.clock = capacity, idle_s, per_client, clock
        self._episodes: OrderedDict[str, Episode] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()
        fix_mmap_threshold()  # a closed episode's big blocks go back to the system (see sqlenv.sandbox.native_memory)

    @property
    def shared_room(self) -> int:
        """While fewer episodes than this are open (half the capacity), a client may open more than one: beyond it,
        each client one (up to `per_client` while there is room, one place at a time after)."""
        return self.capacity // 2

    def __len__(self) -> int:
        with self._lock:
            return len(self._episodes)

    def refusal(self, client: str = "", replaces: Any = None) -> str | None:
        """Why `client` cannot open an episode now (the `PlayFull` message), or None; `replaces` is the handle of
        the episode its page holds, which a new one replaces. Run before the environment is built, so a refused
        visitor costs nothing; `open` checks again."""
        with self._lock:
            dropped = self._expired()
            why = self._refusal(client, replaces)
        self._finish(dropped)
        return why

    def open(self, env: Any, key: tuple, session: str | None = None, client: str = "", replaces: Any = None) -> str:
        """Keep `env` open for a new episode of `client`, replacing its page's episode `replaces` (closed); returns
        its handle (unguessable: the page's state holds it). Raises `PlayFull` when there is no room for it (the
        caller keeps `env`); no other episode played within `idle_s` is closed for it."""
        handle = secrets.token_urlsafe(16)
        with self._lock:
            old = self._episodes.pop(replaces, None) if isinstance(replaces, str) else None
            dropped = self._expired() + ([old] if old is not None else [])
            why = self._refusal(client)
            if why is None:
                self._episodes[handle] = Episode(env, key, session, client, self.clock())
        self._finish(dropped)
        if why is not None:
            raise PlayFull(why)
        return handle

    def _refusal(self, client: str, replaces: Any = None) -> str | None:  # under the lock, expired ones swept
        held = [e for h, e in self._episodes.items() if h != replaces]
        own = sum(e.client == client for e in held)
        if len(held) >= self.capacity:
            why = (f"Play is full: {self.capacity} episodes are open, each played within "
                   f"{duration_words(self.idle_s)}.")
        elif own >= self.per_client:
            why = f"You already have {own} episodes open (from this page or others at your address)."
        elif own and len(held) >= self.shared_room:
            why = (f"You already have an episode open (from this page or others at your address), and half of "
                   f"Play's {self.capacity} places or more are taken: one episode per address until they free up.")
        else:
            return None
        yours = "close one of yours or " if own else ""
        first = min(e.used for e in held) + self.idle_s - self.clock() if held else 0.0
        return (f"{why} No one's episode is closed for yours: {yours}try again later (an episode closes after "
                f"{duration_words(self.idle_s)} without a step, or when its page is closed: the least recently "
                f"played one open now within {duration_words(max(0.0, first))}).")

    def take(self, handle: Any) -> Episode | None:
        """The open episode `handle` names, marked busy for one step (give it back with `give_back`); None when
        it is closed or never was. Raises EpisodeBusy while another step of it runs."""
        with self._lock:
            episode = self._episodes.get(handle) if isinstance(handle, str) else None
            if episode is None:
                return None
            if episode.busy:
                raise EpisodeBusy
            episode.busy, episode.used = True, self.clock()
            self._episodes.move_to_end(handle)
            return episode

    def give_back(self, episode: Episode) -> None:
        """End the step that `take` began; an episode closed meanwhile is closed now."""
        with self._lock:
            episode.busy, episode.used = False, self.clock()
            closing = episode.closed
        if closing:
            self._finish([episode])

    def close(self, handle: Any) -> None:
        """Close the episode `handle` names (no-op when it is not open)."""
        with self._lock:
            episode = self._episodes.pop(handle, None) if isinstance(handle, str) else None
        self._finish([episode] if episode else [])

    def close_session(self, session: str | None) -> None:
        """Close every episode the Gradio session `session` opened (its page was closed)."""
        if not session:
            return
        with self._lock:
            handles = [h for h, e in self._episodes.items() if e.session == session]
            dropped = [self._episodes.pop(h) for h in handles]
        self._finish(dropped)

    def sweep(self) -> None:
        """Close the episodes idle for `idle_s` or more."""
        with self._lock:
            dropped = self._expired()
        self._finish(dropped)

    def _expired(self) -> list[Episode]:  # under the lock
        now = self.clock()
        handles = [h for h, e in self._episodes.items() if not e.busy and now - e.used >= self.idle_s]
        return [self._episodes.pop(h) for h in handles]

    def _finish(self, dropped: list[Episode]) -> None:
        freed = False
        for episode in dropped:
            with self._lock:
                if episode.busy:  # its step is running: that step closes it when it ends (give_back)
                    episode.closed = True
                    continue
                env, episode.env = episode.env, None  # the last reference: its result is freed with it
            if env is not None:
                close_env(env)
                del env
                freed = True
        if freed and _TRIM is not None:
            _TRIM(0)  # give what the environments held back to the system (a few ms)


class ClientSlots:
    """At most `per_client` Play events of one client running at once.

    Args:
        per_client: events one client may run at once (default `STEPS_PER_CLIENT`).

    `enter(client)` is False when the client already runs that many (refuse the event: waiting would hold a
    worker thread); after a True, `leave(client)` when the event ends. Only clients with a running event are
    remembered, so memory follows the events running (at most Gradio's worker threads).
    """

    def __init__(self, per_client: int = STEPS_PER_CLIENT):
        if per_client < 1:
            raise ValueError(f"ClientSlots needs per_client >= 1, got {per_client}")
        self.per_client = per_client
        self._running: dict[str, int] = {}
        self._lock = threading.Lock()

    def enter(self, client: str) -> bool:
        with self._lock:
            if self._running.get(client, 0) >= self.per_client:
                return False
            self._running[client] = self._running.get(client, 0) + 1
            return True

    def leave(self, client: str) -> None:
        with self._lock:
            left = self._running.pop(client, 0) - 1
            if left > 0:
                self._running[client] = left
