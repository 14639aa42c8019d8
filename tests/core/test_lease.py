"""The lease decisions (hermes.core.lease): held time from the send, renewals, deposition."""

from __future__ import annotations

import pytest

from hermes.core.lease import LeaseState, LeaseTerms

T = LeaseTerms(ttl_s=1.5, renew_s=0.3, retry_s=0.1, margin_s=0.1)


def test_a_candidate_acquires_then_renews_on_schedule() -> None:
    s = LeaseState(T)
    assert not s.held(0.0)
    assert s.next_action(0.0) == ("acquire", pytest.approx(-float("inf")))
    s.sending(10.0)
    s.acquired(1, sent=10.0)
    assert s.held(10.0) and s.held(11.39)
    assert not s.held(11.4)  # sent + ttl - margin
    assert s.next_action(10.1) == ("renew", pytest.approx(10.3))


def test_held_time_counts_from_the_send_not_the_answer() -> None:
    s = LeaseState(T)
    s.acquired(1, sent=10.0)
    s.sending(11.0)
    s.renewed(sent=11.0)  # the answer may arrive much later: it does not matter
    assert s.valid_until == pytest.approx(12.4)
    s.renewed(sent=10.5)  # an older renewal answered late never shortens it
    assert s.valid_until == pytest.approx(12.4)


def test_a_paused_holder_is_deposed_on_waking_even_if_a_renewal_answers() -> None:
    s = LeaseState(T)
    s.acquired(3, sent=0.0)
    s.sending(0.3)
    # paused for 5 s between sending the renewal and reading its answer
    assert not s.held(5.3)
    assert s.expired(5.3) and s.deposed
    s.renewed(sent=0.3)  # a late "ok" does not revive a term that ended
    assert not s.held(5.3)
    assert s.next_action(5.3)[0] == "acquire"


def test_a_renewal_sent_after_the_term_ran_out_ends_it() -> None:
    s = LeaseState(T)
    s.acquired(1, sent=0.0)
    s.renewed(sent=2.0)  # sent past valid_until (1.4): the store may have granted another
    assert s.deposed and not s.held(2.0)


def test_lost_and_epochs_only_grow() -> None:
    s = LeaseState(T)
    s.acquired(4, sent=0.0)
    s.lost()
    assert not s.held(0.1) and s.deposed
    with pytest.raises(ValueError, match="not above"):
        s.acquired(4, sent=1.0)
    s.acquired(5, sent=1.0)
    assert s.held(1.1) and s.epoch == 5


@pytest.mark.parametrize("kw, what", [({"ttl_s": 0}, "ttl_s"), ({"renew_s": 1.5}, "renew_s"),
                                      ({"retry_s": 0}, "retry_s"), ({"margin_s": -1}, "margin_s")])
def test_bad_terms_are_refused_naming_the_field(kw: dict, what: str) -> None:
    with pytest.raises(ValueError, match=what):
        LeaseTerms(**kw)


def test_epoch_gate_rejects_a_deposed_leaders_messages_and_follows_a_new_one() -> None:
    from hermes.core.lease import EpochGate

    g = EpochGate()
    assert g.judge(None) == "apply"  # a lone scheduler: nothing stamped, always applied
    assert g.judge(3) == "new"
    assert g.judge(3) == "apply"
    assert g.judge(2) == "stale" and g.stale_rejected == 1
    assert g.judge(5) == "new" and g.epoch == 5
    assert g.judge(3) == "stale" and g.judge(4) == "stale" and g.stale_rejected == 3
    assert g.judge(None) == "apply" and g.epoch == 5
