//! The parent's side of stream credit (PROTOCOL.md 6): grants as the consumer reads, the grant
//! policy, and the adaptive window's operations (round trips, caps, consumed_at).

use super::*;

impl Connection {
    /// Parent: grant `bytes` of credit to stream `id` (`CREDIT_OVERFLOW` if it would exceed
    /// 2^31 - 1). Prefer [`consumed`](Connection::consumed), which applies the grant policy.
    pub fn send_credit(
        &mut self,
        id: u64,
        bytes: u32,
        out: &mut impl FrameBuf,
    ) -> Result<(), ProtocolError> {
        self.check_can_send(FrameType::Credit, id)?;
        let req = self.in_flight_state(id, FrameType::Credit)?;
        if req.kind != MethodKind::Stream {
            return Err(err(
                ErrorCode::KindMismatch,
                id,
                "CREDIT for a unary request",
            ));
        }
        // The worker fails a connection that sends another frame for an id whose REQUEST is
        // still arriving (section 5).
        if req.sending.is_some() {
            return Err(err(
                ErrorCode::Continuation,
                id,
                "CREDIT for a request still being sent",
            ));
        }
        if bytes == 0 {
            return Err(err(ErrorCode::BadPayload, id, "CREDIT of 0 bytes"));
        }
        let credit = req.credit + i64::from(bytes);
        if credit > MAX_CREDIT {
            return Err(err(
                ErrorCode::CreditOverflow,
                id,
                format!("credit {} + {bytes} exceeds 2^31 - 1", req.credit),
            ));
        }
        req.credit = credit;
        req.consumed = req.consumed.saturating_sub(u64::from(bytes));
        put_header(out, FrameType::Credit, false, id, 4)?;
        out.put_u32_le(bytes);
        Ok(())
    }

    /// Parent: the consumer has read `bytes` of ROWS payload of stream `id`
    /// (`rows.payload().len()` of each [`Event::Rows`]). The bytes add to the stream's consumed
    /// count; the grant is [`grant`](crate::grant)'s (PROTOCOL.md 14.5): once half the window is
    /// consumed, a CREDIT for it is encoded into `out`. Returns the bytes granted: 0 (nothing
    /// written, never an error) below half the window, while the stream's request is still
    /// being sent (the bytes stay counted), after the request ended, and once the connection
    /// failed or said GOODBYE.
    pub fn consumed(
        &mut self,
        id: u64,
        bytes: usize,
        out: &mut impl FrameBuf,
    ) -> Result<u32, ProtocolError> {
        let closed = self.goodbye || self.send_closed || self.failed.is_some();
        let Some(req) = self.requests.get_mut(&id) else {
            return Ok(0);
        };
        if req.kind != MethodKind::Stream {
            return Ok(0);
        }
        req.consumed = req.consumed.saturating_add(bytes as u64);
        if closed || req.sending.is_some() {
            return Ok(0);
        }
        let granted = crate::policy::grant(req.window, req.credit, req.consumed);
        if granted == 0 {
            return Ok(0);
        }
        self.send_credit(id, granted, out)?;
        Ok(granted)
    }

    /// Parent: the driver measured a PING's round trip (its send to its PONG, microseconds; 0
    /// counts as 1). [`consumed_at`](Connection::consumed_at) adapts windows to the smallest
    /// seen: a PONG that waited behind queued rows measures the queue, not the link.
    pub fn observe_rtt(&mut self, rtt_us: u64) {
        let rtt = rtt_us.max(1);
        if self.min_rtt_us == 0 || rtt < self.min_rtt_us {
            self.min_rtt_us = rtt;
        }
    }

    /// Parent: the caps of PROTOCOL.md 6 on the adaptive windows (defaults
    /// [`MAX_STREAM_WINDOW`], [`MAX_CONNECTION_WINDOW`]); a window above a lowered cap stays
    /// until it shrinks.
    pub fn set_window_caps(&mut self, max_stream_window: u32, max_connection_window: u32) {
        self.window_caps = (max_stream_window, max_connection_window);
    }

    /// Parent: [`consumed`](Connection::consumed) with the driver's monotonic clock `now_us`,
    /// adapting the stream's window at each grant ([`stream_window`](crate::stream_window),
    /// PROTOCOL.md 6) from the time since its previous grant (the first call starts its clock)
    /// and the round trip of [`observe_rtt`](Connection::observe_rtt): the grant is the
    /// consumed bytes plus the new window minus the old (a capped rest waits). Without a round
    /// trip observed the window stays `initial_credit`.
    pub fn consumed_at(
        &mut self,
        id: u64,
        bytes: usize,
        now_us: u64,
        out: &mut impl FrameBuf,
    ) -> Result<u32, ProtocolError> {
        let initial = self.welcome.map_or(0, |w| w.initial_credit);
        let closed = self.goodbye || self.send_closed || self.failed.is_some();
        let (max_stream, max_connection) = self.window_caps;
        let total: u64 = self
            .requests
            .values()
            .filter(|r| r.kind == MethodKind::Stream)
            .map(|r| u64::from(r.window))
            .sum();
        let rtt = self.min_rtt_us;
        let Some(req) = self.requests.get_mut(&id) else {
            return Ok(0);
        };
        if req.kind != MethodKind::Stream || closed {
            return Ok(0);
        }
        req.consumed = req.consumed.saturating_add(bytes as u64);
        let since = *req.clock.get_or_insert(now_us);
        if req.sending.is_some() {
            return Ok(0);
        }
        let old = req.window;
        if crate::policy::grant(old, req.credit, req.consumed) == 0 {
            return Ok(0);
        }
        let room = u64::from(max_connection).saturating_sub(total);
        // Rows the consumer has not read yet (window - credit - consumed): a consumer behind on
        // what arrived drains a backlog, which says nothing of the window; it never grows then.
        let unread = i64::from(old) - req.credit - req.consumed as i64;
        let behind = unread >= i64::from(old / 4);
        let grown = crate::policy::stream_window(
            old,
            initial,
            now_us.saturating_sub(since),
            rtt,
            max_stream,
            room,
        );
        let new = if behind { grown.min(old) } else { grown };
        // >= 0: a halving takes at most half the window, and half of it was consumed.
        let want = (req.consumed + u64::from(new)).saturating_sub(u64::from(old));
        let room = u64::try_from(MAX_CREDIT.saturating_sub(req.credit)).unwrap_or(0);
        let granted = want.min(room) as u32;
        if granted > 0 {
            self.send_credit(id, granted, out)?;
        }
        if let Some(req) = self.requests.get_mut(&id) {
            req.clock = Some(now_us);
            req.window = new;
            req.consumed = want - u64::from(granted);
        }
        Ok(granted)
    }
}
