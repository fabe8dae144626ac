//! The heartbeat's two clocks (PROTOCOL.md 8.5), sans-IO: the lifecycle task feeds it its
//! housekeeping ticks and what the reader saw, and sends the PINGs it asks for.
//!
//! Liveness means progress, not bytes: a worker is hung when the oldest PING it has not
//! answered is older than 3 x `heartbeat_ms` (the PONG clock), or when one frame has been
//! arriving for longer than that (the frame clock). Bytes of other frames reset neither.
//!
//! The reader pays nothing for the frame clock: at each tick the lifecycle compares the bytes
//! of the incomplete frame the decoder holds with the bytes read since it first saw a frame
//! incomplete. A frame still arriving holds more than was read since; a frame that started
//! later holds at most that. So the clock reads no time on the hot path, and is late by at
//! most one tick.

use std::collections::VecDeque;

/// PINGs in flight at most: a worker this far behind is judged by the first of them anyway,
/// and a parent that keeps running late (it never judges) must not queue them without bound.
const MAX_UNANSWERED: usize = 8;

/// Why a worker was found hung.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Hung {
    /// No PONG answered the oldest unanswered PING, sent this many ms ago.
    PongOverdue { ms: u64 },
    /// One frame has been incomplete for this many ms.
    FrameStalled { ms: u64 },
}

/// What one tick asks of the lifecycle task.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Tick {
    /// Send a PING with this nonce (little-endian).
    pub ping: Option<u64>,
    /// Kill the worker: it made no progress within 3 x `heartbeat_ms`.
    pub hung: Option<Hung>,
}

/// What the reader has seen, read under the core's lock so the numbers agree.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Seen {
    /// The highest nonce a PONG answered (a PONG answers every earlier PING too).
    pub answered: u64,
    /// Bytes of the incomplete frame the decoder holds (0 between frames).
    pub incomplete_frame: usize,
    /// Bytes read from the worker so far.
    pub bytes_in: u64,
}

/// A frame seen incomplete: since when, and the bytes read by then.
#[derive(Clone, Copy, Debug)]
struct FrameWatch {
    since_ms: u64,
    bytes_in: u64,
}

/// Both clocks of one worker connection, in ms on the pool's clock.
#[derive(Debug)]
pub(crate) struct Liveness {
    heartbeat_ms: u64,
    /// A tick later than this after the previous one means the parent itself ran late.
    late_gap_ms: u64,
    /// PINGs sent and not answered, oldest first: (nonce, sent at).
    unanswered: VecDeque<(u64, u64)>,
    last_nonce: u64,
    next_ping_ms: u64,
    frame: Option<FrameWatch>,
    last_tick_ms: u64,
    /// No verdict before this: the parent ran late, so the reader may not have read yet.
    judge_after_ms: u64,
}

impl Liveness {
    /// Clocks for `heartbeat_ms` > 0, ticked every `tick_ms`, starting at `now_ms`.
    pub fn new(heartbeat_ms: u64, tick_ms: u64, now_ms: u64) -> Liveness {
        Liveness {
            heartbeat_ms,
            late_gap_ms: heartbeat_ms.max(2 * tick_ms).max(1),
            unanswered: VecDeque::with_capacity(MAX_UNANSWERED),
            last_nonce: 0,
            next_ping_ms: now_ms + heartbeat_ms,
            frame: None,
            last_tick_ms: now_ms,
            judge_after_ms: 0,
        }
    }

    /// One housekeeping tick at `now_ms`.
    pub fn tick(&mut self, now_ms: u64, seen: Seen) -> Tick {
        // If this tick itself ran late (the parent's runtime was blocked), the reader was
        // starved too and may not have read what the worker sent: no verdict for a heartbeat.
        if now_ms.saturating_sub(self.last_tick_ms) > self.late_gap_ms {
            self.judge_after_ms = now_ms + self.heartbeat_ms;
        }
        self.last_tick_ms = now_ms;
        while self
            .unanswered
            .front()
            .is_some_and(|&(n, _)| n <= seen.answered)
        {
            self.unanswered.pop_front();
        }
        self.frame = match self.frame {
            _ if seen.incomplete_frame == 0 => None,
            Some(w) if seen.incomplete_frame as u64 > seen.bytes_in.saturating_sub(w.bytes_in) => {
                Some(w)
            }
            _ => Some(FrameWatch {
                since_ms: now_ms,
                bytes_in: seen.bytes_in,
            }),
        };
        let limit = u64::from(wirepool_proto::constants::HEARTBEAT_MISSES) * self.heartbeat_ms;
        let mut out = Tick::default();
        if now_ms >= self.judge_after_ms {
            let pong = self
                .unanswered
                .front()
                .map(|&(_, at)| now_ms.saturating_sub(at));
            let frame = self.frame.map(|w| now_ms.saturating_sub(w.since_ms));
            out.hung = match (pong, frame) {
                (Some(ms), _) if ms > limit => Some(Hung::PongOverdue { ms }),
                (_, Some(ms)) if ms > limit => Some(Hung::FrameStalled { ms }),
                _ => None,
            };
        }
        if out.hung.is_none() && now_ms >= self.next_ping_ms {
            self.next_ping_ms = now_ms + self.heartbeat_ms;
            if self.unanswered.len() < MAX_UNANSWERED {
                self.last_nonce += 1;
                self.unanswered.push_back((self.last_nonce, now_ms));
                out.ping = Some(self.last_nonce);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HB: u64 = 100;
    const TICK: u64 = 10;

    /// Ticks every 10 ms from `from` to `to` (inclusive), answering every PING at once if
    /// `answer`, with the reader's view given by `frame(now)` (incomplete bytes, bytes in).
    fn run(
        l: &mut Liveness,
        from: u64,
        to: u64,
        answer: bool,
        answered: &mut u64,
        frame: impl Fn(u64) -> (usize, u64),
    ) -> Option<(u64, Hung)> {
        let mut now = from;
        while now <= to {
            let (incomplete_frame, bytes_in) = frame(now);
            let t = l.tick(
                now,
                Seen {
                    answered: *answered,
                    incomplete_frame,
                    bytes_in,
                },
            );
            if let Some(h) = t.hung {
                return Some((now, h));
            }
            if let (Some(n), true) = (t.ping, answer) {
                *answered = n;
            }
            now += TICK;
        }
        None
    }

    #[test]
    fn answered_pings_keep_a_worker_alive() {
        let mut l = Liveness::new(HB, TICK, 0);
        let mut answered = 0;
        assert_eq!(
            run(&mut l, 10, 5_000, true, &mut answered, |_| (0, 0)),
            None
        );
        assert!(answered >= 40, "a PING every heartbeat: {answered}");
    }

    #[test]
    fn the_pong_clock_fires_whatever_else_arrives() {
        let mut l = Liveness::new(HB, TICK, 0);
        let mut answered = 0;
        // Whole frames keep arriving (bytes in grows, never an incomplete frame): no PONG.
        let (at, why) = run(&mut l, 10, 5_000, false, &mut answered, |now| (0, now * 7)).unwrap();
        // The first PING left at 100 ms; hung once it is more than 300 ms old.
        assert_eq!(why, Hung::PongOverdue { ms: 310 });
        assert_eq!(at, 410);
    }

    #[test]
    fn a_pong_answers_its_ping_and_every_earlier_one() {
        let mut l = Liveness::new(HB, TICK, 0);
        let seen = |answered| Seen {
            answered,
            ..Seen::default()
        };
        let mut nonces = Vec::new();
        for now in (10..=350).step_by(10) {
            let t = l.tick(now, seen(0));
            assert_eq!(t.hung, None);
            nonces.extend(t.ping);
        }
        assert_eq!(nonces, vec![1, 2, 3]);
        // Only PONG 2 comes back: PINGs 1 and 2 are answered, the clock runs from PING 3 (300).
        for now in (360..=600).step_by(10) {
            assert_eq!(l.tick(now, seen(2)).hung, None, "at {now}");
        }
        assert_eq!(
            l.tick(610, seen(2)).hung,
            Some(Hung::PongOverdue { ms: 310 })
        );
    }

    #[test]
    fn the_frame_clock_fires_on_a_trickled_frame_even_with_pongs_answered() {
        let mut l = Liveness::new(HB, TICK, 0);
        let mut answered = 0;
        // From 1000 ms one frame grows by a byte per tick and never completes; PINGs are
        // answered (as if the PONG clock were satisfied): only the frame clock can see it.
        let frame = |now: u64| match now {
            ..1000 => (0, 500),
            _ => (
                1 + ((now - 1000) / TICK) as usize,
                501 + (now - 1000) / TICK,
            ),
        };
        let (at, why) = run(&mut l, 10, 5_000, true, &mut answered, frame).unwrap();
        assert_eq!((at, why), (1310, Hung::FrameStalled { ms: 310 }));
    }

    #[test]
    fn frames_that_complete_do_not_run_the_frame_clock() {
        let mut l = Liveness::new(HB, TICK, 0);
        let mut answered = 0;
        // Every tick ends inside a frame, but a different one each time: 1 KiB read per tick,
        // the incomplete frame holds 100 bytes of it (a stream of rows, read mid-frame).
        let frame = |now: u64| (100, (now / TICK) * 1024);
        assert_eq!(run(&mut l, 10, 5_000, true, &mut answered, frame), None);
    }

    #[test]
    fn a_parent_that_ran_late_does_not_blame_the_worker() {
        let mut l = Liveness::new(HB, TICK, 0);
        let seen = |answered| Seen {
            answered,
            ..Seen::default()
        };
        assert_eq!(l.tick(100, seen(0)).ping, Some(1));
        // The parent's runtime was blocked for 2 s: PONG 1 may be waiting unread in the socket.
        let t = l.tick(2_100, seen(0));
        assert_eq!(t.hung, None, "judged on a tick that ran late");
        // The reader catches up within the heartbeat that follows.
        assert_eq!(l.tick(2_110, seen(1)).hung, None);
        assert_eq!(l.tick(2_200, seen(1)).hung, None);
        // Whereas a worker that stays silent is judged once a heartbeat has passed.
        let mut l = Liveness::new(HB, TICK, 0);
        l.tick(100, seen(0));
        assert_eq!(l.tick(2_100, seen(0)).hung, None);
        assert_eq!(l.tick(2_150, seen(0)).hung, None);
        assert!(matches!(
            l.tick(2_210, seen(0)).hung,
            Some(Hung::PongOverdue { .. })
        ));
    }

    #[test]
    fn unanswered_pings_are_bounded() {
        let mut l = Liveness::new(HB, TICK, 0);
        let mut now = 0;
        // Every tick late: never judged, and PINGs stop queueing at the bound.
        for _ in 0..100 {
            now += 1_000;
            l.tick(now, Seen::default());
        }
        assert_eq!(l.unanswered.len(), MAX_UNANSWERED);
    }
}
