//! The connection's receive path (PROTOCOL.md 5-8): bytes in, checked frames and events out,
//! large messages reassembled from their CONTINUATION frames, the worker's side of the handshake.

use super::*;

impl Connection {
    /// Append received bytes (copies them; see [`read_buffer`](Connection::read_buffer)).
    pub fn receive(&mut self, bytes: &[u8]) {
        self.decoder.receive(bytes);
    }

    /// The receive buffer, with room for the rest of the current frame: read the socket
    /// straight into it, then call [`next_event`](Connection::next_event) until `Ok(None)`.
    pub fn read_buffer(&mut self) -> &mut BytesMut {
        self.decoder.read_buffer()
    }

    /// The next event, `Ok(None)` when more bytes are needed, or a fatal error.
    ///
    /// Call it until `Ok(None)` after each read: one read may hold many frames.
    pub fn next_event(&mut self) -> Result<Option<Event>, ProtocolError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if let Some(e) = self.descriptor_error.take() {
            return Err(self.fail(e));
        }
        loop {
            let frame = match self.decoder.next_decoded() {
                Ok(Some(Decoded::Frame(frame))) => frame,
                Ok(Some(Decoded::Shm { id, frame })) => match self.on_shm(id, frame) {
                    Ok(Some(event)) => return Ok(Some(event)),
                    Ok(None) => continue,
                    Err(e) => return Err(self.fail(e)),
                },
                Ok(None) => {
                    if self.lend_to_message() {
                        continue;
                    }
                    return Ok(None);
                }
                Err(e) => return Err(self.fail(e)),
            };
            self.lent_back = self.decoder.take_returned();
            let handled = self.on_frame(frame);
            // Not taken (the frame was late, or failed): its buffer is not held any longer.
            self.lent_back = None;
            match handled {
                Ok(Some(event)) => return Ok(Some(event)),
                Ok(None) => continue,
                Err(e) => return Err(self.fail(e)),
            }
        }
    }

    /// Batch form of [`next_event`](Connection::next_event) (PROTOCOL.md 14.4): appends every
    /// event available now to `out` and returns how many. On a protocol violation the events
    /// before it are in `out` (act on them, then send the error with
    /// [`send_fatal`](Connection::send_fatal)) and the error is returned; the core is failed.
    ///
    /// ```
    /// use wirepool_proto::{Connection, Event, Hello};
    /// let mut worker = Connection::new_worker();
    /// let mut wire = Vec::new();
    /// worker.send_hello(&Hello::new("doc", "1"), &mut wire).unwrap();
    /// worker.send_ping([7; 8], &mut wire).unwrap_err(); // refused: before WELCOME
    /// let mut parent = Connection::new_parent();
    /// parent.receive(&wire);
    /// let mut events = Vec::new();
    /// assert_eq!(parent.next_events(&mut events).unwrap(), 1);
    /// assert!(matches!(events[..], [Event::Hello(_)]));
    /// ```
    pub fn next_events(&mut self, out: &mut Vec<Event>) -> Result<usize, ProtocolError> {
        let before = out.len();
        while let Some(event) = self.next_event()? {
            out.push(event);
        }
        Ok(out.len() - before)
    }

    /// The peer closed the stream. `TRUNCATED` if it stopped inside a frame; otherwise `Ok`
    /// and the driver ends what is still in flight ([`in_flight_ids`](Connection::in_flight_ids)).
    pub fn end_of_input(&mut self) -> Result<(), ProtocolError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let ended = self.decoder.end_of_input().map_err(|e| self.fail(e));
        self.drop_peer_regions();
        ended
    }

    /// The connection is over (end of input, or failed): the peer's regions leave the table
    /// (PROTOCOL.md 20.4); each stays mapped while views of it exist.
    pub(super) fn drop_peer_regions(&mut self) {
        if let Some(lane) = self.lane.as_mut() {
            lane.mapped.clear();
            lane.lender.drop_holds();
        }
    }

    /// A large first frame with MORE is arriving: see [`lend_to_first`](Self::lend_to_first).
    /// A large CONTINUATION of a message in progress is arriving: lend the decoder the rest of
    /// the message's own buffer, so the payload is read straight into its final place instead
    /// of being copied there afterwards. Only when the frame will pass the size checks (else it
    /// takes the ordinary way and fails there), and within the connection's bound.
    pub(super) fn lend_to_message(&mut self) -> bool {
        let Some(h) = self.decoder.pending_large() else {
            return false;
        };
        if h.more
            && matches!(
                h.frame_type,
                FrameType::Request | FrameType::Result | FrameType::End
            )
        {
            return self.lend_to_first(h);
        }
        if h.frame_type != FrameType::Continuation {
            return false;
        }
        let limit = self.welcome.map_or(u64::MAX, |w| w.max_message_size);
        let Some(partial) = self.partials.get_mut(&h.id) else {
            return false;
        };
        let len = u64::from(h.length);
        if partial.size + len > limit || self.partial_bytes + len > limit {
            return false;
        }
        let others = self.partial_bytes - partial.size;
        let budget = usize::try_from(limit - others).unwrap_or(usize::MAX);
        grow_body(&mut partial.body, h.length as usize, budget);
        // The view after the body, cut to exactly this payload: contiguous with the body, so
        // taking it back (`unsplit`) copies nothing.
        let mut tail = partial.body.split_off(partial.body.len());
        drop(tail.split_off(h.length as usize));
        self.decoder.lend(tail);
        true
    }

    /// The large first frame of a continued message is arriving: read it straight into the
    /// buffer the message will be reassembled in, so it is not copied there afterwards (issue
    /// 13). The buffer is the spare one when the reader has dropped the last message and it is
    /// large enough for a message as large as the last one, else a new one of that size (or
    /// twice this frame), within what the connection may still hold (`receive_budget`). Only on
    /// an open connection, for a type this side receives, and when the frame will pass the
    /// size checks of 11.2 step 6 (else it takes the ordinary way and fails there, in order):
    /// the wire does not announce a continued message's total, so nothing is reserved from a
    /// peer's claim, only from checked lengths.
    pub(super) fn lend_to_first(&mut self, h: Header) -> bool {
        let Some(welcome) = self.welcome else {
            return false;
        };
        if !self.role.receives(h.frame_type) || self.failed.is_some() {
            return false;
        }
        let limit = welcome.max_message_size;
        let len = u64::from(h.length);
        if len > limit || self.partial_bytes + len > limit {
            return false;
        }
        let len = h.length as usize;
        let prefix = crate::decode::prefix_len(h.frame_type);
        let want = (self.last_message_len + prefix)
            .max(len.saturating_mul(2))
            .min(self.receive_budget())
            .max(len);
        let mut body = std::mem::take(&mut self.spare);
        if !body.try_reclaim(want) {
            body = BytesMut::with_capacity(want);
        }
        // The payload's view is the start of the buffer cut to exactly its length (a read
        // cannot run past the frame); the rest stays as `spare` until `start_partial` takes it
        // back (contiguous: `unsplit` copies nothing).
        self.spare = body.split_off(len);
        self.decoder.lend(body);
        true
    }

    pub(super) fn fail(&mut self, e: ProtocolError) -> ProtocolError {
        self.failed = Some(e.clone());
        self.drop_peer_regions();
        e
    }

    pub(super) fn on_frame(&mut self, frame: Frame) -> Result<Option<Event>, ProtocolError> {
        let ty = frame.frame_type();
        let id = frame.id;
        let unexpected = |why: &str| {
            err(
                ErrorCode::UnexpectedFrame,
                id,
                format!("{} {why}", ty.name()),
            )
        };

        // 1. Handshake phase and direction. ERROR id 0 (a refusal or a fatal report) is
        //    allowed at any time.
        if ty == FrameType::Error && id == 0 {
            return Ok(Some(event_from_frame(frame)));
        }
        match self.role {
            Role::Parent => {
                if self.hello.is_none() {
                    let FrameBody::Hello(hello) = frame.body else {
                        return Err(unexpected("before HELLO"));
                    };
                    choose_version(&hello, self.versions.0, self.versions.1)?;
                    self.hello = Some((*hello).clone());
                    return Ok(Some(Event::Hello(hello)));
                }
                if !self.is_open() {
                    return Err(unexpected("before WELCOME was sent"));
                }
                if !self.role.receives(ty) {
                    return Err(unexpected("is never sent by a worker"));
                }
                if ty == FrameType::Hello {
                    return Err(unexpected("a second time"));
                }
                if self.goodbye {
                    return Err(unexpected("after GOODBYE"));
                }
            }
            Role::Worker => {
                if self.welcome.is_none() {
                    let (Some(hello), FrameBody::Welcome(welcome)) = (&self.hello, &frame.body)
                    else {
                        return Err(unexpected(if self.hello.is_none() {
                            "before the worker's HELLO"
                        } else {
                            "before WELCOME"
                        }));
                    };
                    welcome.check_against(hello)?;
                    let welcome = *welcome;
                    self.open_with(welcome);
                    return Ok(Some(Event::Welcome(welcome)));
                }
                if !self.role.receives(ty) {
                    return Err(unexpected("is never sent by a parent"));
                }
                if ty == FrameType::Welcome {
                    return Err(unexpected("a second time"));
                }
                if ty == FrameType::Error {
                    return Err(unexpected(
                        "with a request id: a parent stops a request with CANCEL",
                    ));
                }
            }
        }

        // Connection-level frames.
        if ty.id_rule() == crate::frame::IdRule::Zero || (ty == FrameType::Event && id == 0) {
            match ty {
                FrameType::Drain => self.draining = true,
                FrameType::Goodbye => self.goodbye = true,
                _ => {}
            }
            return Ok(Some(event_from_frame(frame)));
        }

        // 2. Ids.
        if ty == FrameType::Request {
            if id <= self.highest_id {
                return Err(err(
                    ErrorCode::DuplicateId,
                    id,
                    format!(
                        "REQUEST id {id} is not above the previous {}",
                        self.highest_id
                    ),
                ));
            }
            self.highest_id = id;
            if frame.more {
                let size = frame_payload_len(&frame);
                self.start_partial(frame, size)?;
                return Ok(None);
            }
            return Ok(Some(self.accept(frame)));
        }
        if id > self.highest_id {
            return Err(err(
                ErrorCode::UnknownId,
                id,
                format!(
                    "{} for id {id}, above every request id ({})",
                    ty.name(),
                    self.highest_id
                ),
            ));
        }

        // 3. Continuation.
        if self.partials.contains_key(&id) {
            return self.on_frame_mid_message(frame);
        }
        if ty == FrameType::Continuation {
            return Err(err(
                ErrorCode::Continuation,
                id,
                "CONTINUATION with no message in progress",
            ));
        }

        // 4. Late frames: ids at or below the highest that are not in flight.
        let Some(req) = self.requests.get_mut(&id) else {
            return Ok(Some(Event::Late { id, frame: ty }));
        };

        // 5. Kind, 6. counters.
        let kind_mismatch = |what: &str| {
            err(
                ErrorCode::KindMismatch,
                id,
                format!("{} for a {what} request", ty.name()),
            )
        };
        match (self.role, &frame.body) {
            (Role::Worker, FrameBody::Cancel) => Ok(Some(Event::Cancel { id })),
            (Role::Worker, FrameBody::Credit { bytes }) => {
                if req.kind != MethodKind::Stream {
                    return Err(kind_mismatch("unary"));
                }
                let credit = req.credit + i64::from(*bytes);
                if credit > MAX_CREDIT {
                    return Err(err(
                        ErrorCode::CreditOverflow,
                        id,
                        format!("credit {} + grant {bytes} exceeds 2^31 - 1", req.credit),
                    ));
                }
                req.credit = credit;
                Ok(Some(Event::Credit { id, bytes: *bytes }))
            }
            (Role::Parent, FrameBody::Rows(rows)) => {
                if req.kind != MethodKind::Stream {
                    return Err(kind_mismatch("unary"));
                }
                if req.credit <= 0 {
                    return Err(err(
                        ErrorCode::FlowControl,
                        id,
                        format!("ROWS while the stream's credit is {}", req.credit),
                    ));
                }
                req.charge_rows(rows.count(), rows.payload().len());
                Ok(Some(event_from_frame(frame)))
            }
            (Role::Parent, FrameBody::End { row_count, .. }) => {
                if req.kind != MethodKind::Stream {
                    return Err(kind_mismatch("unary"));
                }
                if *row_count != req.rows {
                    return Err(err(
                        ErrorCode::RowCountMismatch,
                        id,
                        format!("END says {row_count} rows, {} were received", req.rows),
                    ));
                }
                self.finish_or_start(frame)
            }
            (Role::Parent, FrameBody::Result { .. }) => {
                if req.kind != MethodKind::Unary {
                    return Err(kind_mismatch("stream"));
                }
                self.finish_or_start(frame)
            }
            (Role::Parent, FrameBody::Error { .. }) => {
                self.requests.remove(&id);
                Ok(Some(event_from_frame(frame)))
            }
            // EVENT for a request in flight.
            _ => Ok(Some(event_from_frame(frame))),
        }
    }

    /// Parent: a terminal RESULT/END, complete or the first frame of a continued one.
    pub(super) fn finish_or_start(&mut self, frame: Frame) -> Result<Option<Event>, ProtocolError> {
        if frame.more {
            let size = frame_payload_len(&frame);
            self.start_partial(frame, size)?;
            return Ok(None);
        }
        self.requests.remove(&frame.id);
        Ok(Some(event_from_frame(frame)))
    }

    pub(super) fn start_partial(
        &mut self,
        mut first: Frame,
        size: u64,
    ) -> Result<(), ProtocolError> {
        // A large first frame read into a lent buffer (`lend_to_first`): the frame holds only
        // its prefix, the buffer the whole payload.
        let lent = self.lent_back.take();
        let size = lent.as_ref().map_or(size, |b| b.len() as u64);
        self.check_message_size(first.id, size)?;
        self.check_partial_bytes(first.id, self.partial_bytes + size)?;
        self.partial_bytes += size;
        if let Some(mut body) = lent {
            body.unsplit(std::mem::take(&mut self.spare));
            body.advance(crate::decode::prefix_len(first.frame_type()));
            self.insert_partial(first, body, size);
            return Ok(());
        }
        let chunk = match &mut first.body {
            FrameBody::Request { body, .. }
            | FrameBody::Result { body }
            | FrameBody::End { summary: body, .. } => std::mem::take(body),
            _ => Bytes::new(),
        };
        // Sized for the message as large as the last one (or twice this chunk), within what
        // this connection may still hold: checked sizes only, never a peer's claim.
        let budget = self.receive_budget();
        if chunk.is_empty() && self.lane.is_some() {
            // Likely a body in shared memory (a first frame of only its prefix, 20.3): reserve
            // nothing; a CONTINUATION that follows instead grows the buffer as it arrives.
            self.insert_partial(first, BytesMut::new(), size);
            return Ok(());
        }
        let mut body = std::mem::take(&mut self.spare);
        if !body.try_reclaim(chunk.len()) {
            let guess = self.last_message_len.max(chunk.len() * 2);
            body = BytesMut::with_capacity(guess.min(budget).max(chunk.len()));
        }
        body.extend_from_slice(&chunk);
        self.insert_partial(first, body, size);
        Ok(())
    }

    /// A message in progress from its first frame (already checked and counted).
    pub(super) fn insert_partial(&mut self, first: Frame, body: BytesMut, size: u64) {
        let partial = Partial {
            first,
            body,
            size,
            continued: false,
        };
        self.partials.insert(partial.first.id, partial);
    }

    /// The most a buffer of a message in progress may reserve: `max_message_size` less what
    /// the other messages in progress hold (section 5's per-connection bound, applied to
    /// capacity too, so reserving ahead never holds more than the wire could fill).
    pub(super) fn receive_budget(&self) -> usize {
        let limit = self.welcome.map_or(u64::MAX, |w| w.max_message_size);
        usize::try_from(limit.saturating_sub(self.partial_bytes)).unwrap_or(usize::MAX)
    }

    pub(super) fn check_message_size(&self, id: u64, size: u64) -> Result<(), ProtocolError> {
        let limit = self.welcome.map_or(u64::MAX, |w| w.max_message_size);
        if size > limit {
            return Err(err(
                ErrorCode::MessageTooLarge,
                id,
                format!("message reached {size} bytes, above max_message_size {limit}"),
            ));
        }
        Ok(())
    }

    /// Section 5: the sum over all messages in progress is bounded by `max_message_size` too.
    pub(super) fn check_partial_bytes(&self, id: u64, total: u64) -> Result<(), ProtocolError> {
        let limit = self.welcome.map_or(u64::MAX, |w| w.max_message_size);
        if total > limit {
            return Err(err(
                ErrorCode::MessageTooLarge,
                id,
                format!(
                    "messages in progress reached {total} bytes, above max_message_size \
                     {limit} for the whole connection"
                ),
            ));
        }
        Ok(())
    }

    pub(super) fn remove_partial(&mut self, id: u64) -> Option<Partial> {
        let partial = self.partials.remove(&id)?;
        self.partial_bytes -= partial.size;
        Some(partial)
    }

    pub(super) fn on_frame_mid_message(
        &mut self,
        frame: Frame,
    ) -> Result<Option<Event>, ProtocolError> {
        let id = frame.id;
        match (self.role, frame.body) {
            (_, FrameBody::Continuation { chunk }) => {
                // The payload is in the message's buffer already (lent), or it is `chunk`.
                let lent = self.lent_back.take();
                let len = lent.as_ref().map_or(chunk.len(), BytesMut::len) as u64;
                let size = self.partials.get(&id).map_or(0, |p| p.size) + len;
                self.check_message_size(id, size)?;
                let total = self.partial_bytes + len;
                self.check_partial_bytes(id, total)?;
                let Some(partial) = self.partials.get_mut(&id) else {
                    return Ok(None);
                };
                // This message's own bytes count once in the budget, not twice.
                let budget = usize::try_from(
                    self.welcome
                        .map_or(u64::MAX, |w| w.max_message_size)
                        .saturating_sub(total - size),
                )
                .unwrap_or(usize::MAX);
                self.partial_bytes = total;
                partial.size = size;
                partial.continued = true;
                if let Some(lent) = lent {
                    partial.body.unsplit(lent);
                } else {
                    grow_body(&mut partial.body, chunk.len(), budget);
                    partial.body.extend_from_slice(&chunk);
                }
                drop(chunk);
                if frame.more {
                    return Ok(None);
                }
                let Some(Partial {
                    mut first,
                    body: mut whole,
                    ..
                }) = self.remove_partial(id)
                else {
                    return Ok(None);
                };
                first.more = false;
                let message = whole.split().freeze();
                self.last_message_len = message.len();
                // What is left is an empty view of the same allocation: reclaimed for the next
                // message once the reader drops this one.
                self.spare = whole;
                Ok(Some(self.complete(first, message)))
            }
            // CANCEL abandons a request still arriving; it still needs a terminal.
            (Role::Worker, FrameBody::Cancel) => {
                self.remove_partial(id);
                Ok(Some(self.reject(id, ErrorCode::Cancelled)))
            }
            // ERROR abandons a result or summary still arriving; it is the terminal.
            (Role::Parent, body @ FrameBody::Error { .. }) => {
                self.remove_partial(id);
                self.requests.remove(&id);
                Ok(Some(event_from_frame(Frame::new(id, body))))
            }
            (_, body) => Err(err(
                ErrorCode::Continuation,
                id,
                format!(
                    "{} for id {id} while a continued message is in progress",
                    body.frame_type().name()
                ),
            )),
        }
    }

    /// A continued message is whole: `message` is its body (or summary).
    pub(super) fn complete(&mut self, mut first: Frame, message: Bytes) -> Event {
        first.more = false;
        match &mut first.body {
            FrameBody::Request { body, .. }
            | FrameBody::Result { body }
            | FrameBody::End { summary: body, .. } => *body = message,
            _ => {}
        }
        if first.frame_type() == FrameType::Request {
            self.accept(first)
        } else {
            self.requests.remove(&first.id);
            event_from_frame(first)
        }
    }

    /// A frame of the shared-memory lane (its types exist only while the lane is on, and the
    /// connection is open: the decoder turned them on with the WELCOME).
    pub(super) fn on_shm(
        &mut self,
        id: u64,
        frame: ShmFrame,
    ) -> Result<Option<Event>, ProtocolError> {
        if self.role == Role::Parent && self.goodbye {
            return Err(err(
                ErrorCode::UnexpectedFrame,
                id,
                format!("shm frame {:#04x} after GOODBYE", frame.type_byte()),
            ));
        }
        let Some(lane) = self.lane.as_mut() else {
            return Err(err(
                ErrorCode::UnknownFrameType,
                id,
                format!("frame type {:#04x}", frame.type_byte()),
            ));
        };
        match frame {
            ShmFrame::Region { region, size } => {
                lane.borrower.region(region, size)?;
                let Some(map) = self.shm_mapper.0.as_mut() else {
                    return Err(err(
                        ErrorCode::ShmBadDescriptor,
                        0,
                        format!("SHM_REGION {region}: this side cannot map regions"),
                    ));
                };
                let mapping = map(region, size)?;
                lane.mapped.insert(region, mapping);
                Ok(None)
            }
            ShmFrame::Release(r) => {
                lane.lender.released(r)?;
                Ok(None)
            }
            ShmFrame::Retire { region } => {
                lane.borrower.retire(region)?;
                // Views of it keep the mapping alive until they are dropped.
                lane.mapped.remove(&region);
                Ok(None)
            }
            ShmFrame::Body(r) => self.on_shm_body(id, r),
        }
    }

    /// SHM_BODY: the last part of the message in progress for `id` (20.3, checks of 20.5).
    pub(super) fn on_shm_body(
        &mut self,
        id: u64,
        r: ShmRange,
    ) -> Result<Option<Event>, ProtocolError> {
        if id > self.highest_id {
            return Err(err(
                ErrorCode::UnknownId,
                id,
                format!(
                    "SHM_BODY for id {id}, above every request id ({})",
                    self.highest_id
                ),
            ));
        }
        let Some(partial) = self.partials.get(&id) else {
            return Err(err(
                ErrorCode::Continuation,
                id,
                "SHM_BODY with no message in progress",
            ));
        };
        if partial.continued || !partial.body.is_empty() {
            return Err(err(
                ErrorCode::Continuation,
                id,
                "SHM_BODY after a body byte or CONTINUATION of its message",
            ));
        }
        let size = partial.size.saturating_add(r.length);
        let Some(lane) = self.lane.as_mut() else {
            return Ok(None);
        };
        lane.borrower.body(id, r)?;
        let mapping = lane.mapped.get(&r.region).cloned();
        self.check_message_size(id, size)?;
        let Some(mapping) = mapping else {
            return Err(err(
                ErrorCode::ShmBounds,
                id,
                format!("region {} is not mapped", r.region),
            ));
        };
        let queue = self.shm_releases.clone();
        let view = mapping.lend(r.offset, r.length, Box::new(move || queue.push(r)))?;
        let Some(Partial { first, .. }) = self.remove_partial(id) else {
            return Ok(None);
        };
        Ok(Some(self.complete(first, view)))
    }

    /// Worker: accept a complete REQUEST or reject it.
    pub(super) fn accept(&mut self, frame: Frame) -> Event {
        let id = frame.id;
        let FrameBody::Request {
            method,
            codec,
            timeout_us,
            body,
        } = frame.body
        else {
            return Event::Late {
                id,
                frame: frame.body.frame_type(),
            };
        };
        let (kind, initial_credit) = match self.check_accept(method, codec) {
            Ok(accepted) => accepted,
            Err(code) => return self.reject(id, code),
        };
        self.requests
            .insert(id, StreamSendState::new(kind, initial_credit));
        Event::Request {
            id,
            method,
            codec,
            timeout_us,
            body,
        }
    }

    /// Section 11.2 step 10, in order: the method's kind and the initial credit, or why the
    /// request is refused.
    pub(super) fn check_accept(
        &self,
        method: u16,
        codec: u8,
    ) -> Result<(MethodKind, u32), ErrorCode> {
        if self.draining {
            return Err(ErrorCode::Draining);
        }
        let info = self
            .hello
            .as_ref()
            .and_then(|h| h.methods.get(method as usize))
            .ok_or(ErrorCode::UnknownMethod)?;
        if !info.codecs.contains(&codec) {
            return Err(ErrorCode::CodecUnsupported);
        }
        let welcome = self.welcome.ok_or(ErrorCode::Overloaded)?;
        if self.requests.len() >= welcome.max_in_flight as usize {
            return Err(ErrorCode::Overloaded);
        }
        Ok((info.kind, welcome.initial_credit))
    }

    /// Worker: refuse request `id`; the driver owes it one ERROR (see `unanswered_rejects`).
    pub(super) fn reject(&mut self, id: u64, code: ErrorCode) -> Event {
        self.unanswered_rejects.insert(id);
        Event::Reject { id, code }
    }

    pub(super) fn open_with(&mut self, welcome: Welcome) {
        self.welcome = Some(welcome);
        self.decoder.set_max_frame_size(welcome.max_frame_size);
        let early = std::mem::take(&mut self.early_descriptors);
        if let Some(accept) = welcome.extensions.shm {
            let (out, inn) = match self.role {
                Role::Parent => (accept.to_worker_window, accept.to_parent_window),
                Role::Worker => (accept.to_parent_window, accept.to_worker_window),
            };
            let mut borrower = Borrower::new(inn);
            if let Err(e) = borrower.descriptors_received(early) {
                self.descriptor_error.get_or_insert(e);
            }
            self.lane = Some(Lane {
                accept,
                lender: Lender::new(out),
                borrower,
                mapped: Default::default(),
            });
            self.decoder.set_shm(true);
        } else if early > 0 {
            self.descriptor_error
                .get_or_insert(lane_off_descriptors(early));
        }
    }
}
