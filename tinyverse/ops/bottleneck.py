"""Which side holds a run's pace back (the players, the trainers, the database), read from the live
workers' heartbeats: their rates, what they wait for, the pace they hold; and the usual fix."""

# what a waiting worker's heartbeat says (pace.py and trainer.py write these words)
PLAYERS_WAIT = "for the trainers"
TRAINERS_WAIT = "for players"
WARMING_UP = "before learning starts"
SAMPLING_WAITS = "for a batch"


def _most_wait(workers: list[dict], why: str) -> bool:
    """Whether most of ``workers`` wait ``why`` (one look at heartbeats: one may be out of date)."""
    return sum(why in (w.get("waiting") or "") for w in workers) * 2 > len(workers) > 0


def side(workers: list[dict]) -> str | None:
    """The side that holds the other back, or None (one side missing, or neither waits): under a
    pace both run at one rate, so the rates cannot tell; the side that waits is the faster one."""
    players = [w for w in workers if w["role"] == "player"]
    trainers = [w for w in workers if w["role"] == "trainer"]
    if not players or not trainers:
        return None
    if _most_wait(trainers, SAMPLING_WAITS):
        return "the database"
    if _most_wait(players, PLAYERS_WAIT):
        return "the trainers"
    waiting = [w for w in trainers if WARMING_UP not in (w.get("waiting") or "")]
    return "the players" if _most_wait(waiting, TRAINERS_WAIT) else None


def bottleneck(workers: list[dict]) -> str | None:
    """A sentence naming the side that limits the pace, with the rates the workers measured and the
    usual fix; None when :func:`side` names none."""
    pace = next((w["pace"] for w in workers if w.get("pace")), None)
    ratio = pace["updates_per_step"] if pace else None
    if (limit := side(workers)) is None or (limit != "the database" and not ratio):
        return None  # without a pace, neither side waits for the other
    steps = sum(w.get("steps_per_s", 0) for w in workers if w["role"] == "player")
    updates = sum(w.get("updates_per_s", 0) for w in workers if w["role"] == "trainer")
    trained, played = f"{updates:.3g} updates/s", f"{steps:,.0f} env steps/s"
    at = f"at {ratio:g} updates an env step"
    if limit == "the trainers":
        fix = "a smaller network, a larger -b per update, or more trainers"
        return f"trainers are the bottleneck: {trained} hold the players to {played} {at}; {fix}"
    if limit == "the players":
        fix = "more players (run --players), more environments a player (-b), or a faster env"
        return f"players are the bottleneck: {played} hold the trainers to {trained} {at}; {fix}"
    fix = "the database nearer the trainers, fewer sessions a batch, or a deeper prefetch"
    return f"the database is the bottleneck: trainers wait for batches to be sampled; {fix}"
