"""Content hashes, stored results with expiry, single-flight."""

from __future__ import annotations

from pipeline.dedupe import SingleFlight, StoredResults, content_hash, normalise


def test_hash_ignores_whitespace_and_unicode_form_but_not_model() -> None:
    a = content_hash("  Caf\u00e9   au lait ", "m@1")
    b = content_hash("Cafe\u0301 au\tlait", "m@1")
    assert a == b
    assert a != content_hash("Café au lait", "m@2")
    assert a != content_hash("Café au laid", "m@1")
    assert normalise(" a \n b ") == "a b"
    assert len(a) == 32 and int(a, 16) >= 0


def test_stored_results_expire_and_survive_round_trip() -> None:
    now = [1_000]
    table: dict[bytes, bytes] = {}
    stored = StoredResults(table, ttl_ms=100, clock_ms=lambda: now[0])
    assert stored.get("ab") is None
    stored.put("ab", b"result")
    assert stored.get("ab") == b"result"
    now[0] += 100
    assert stored.get("ab") == b"result"
    now[0] += 1
    assert stored.get("ab") is None
    table[b"cd"] = b"\x00"  # corrupt entry: ignored, not a crash
    assert stored.get("cd") is None


def test_single_flight_leader_then_joiners_then_fresh_start() -> None:
    flight: SingleFlight[str] = SingleFlight()
    assert flight.join("h", "first") is True
    assert flight.join("h", "second") is False
    assert "h" in flight and len(flight) == 1
    assert flight.finish("h") == ["first", "second"]
    assert flight.join("h", "third") is True
