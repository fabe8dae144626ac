//! The connection's shared-memory lane (PROTOCOL.md 20): the lane's state, the regions held
//! and lent, and the frames that send a body through a region.

use super::*;

impl Connection {
    /// The lane's windows when the WELCOME turned it on (`None`: off, its frames do not exist).
    pub fn shm(&self) -> Option<ShmAccept> {
        self.lane.as_ref().map(|l| l.accept)
    }

    /// This side's regions and lent ranges (what it may still announce and lend), when the
    /// lane is on.
    pub fn shm_lender(&self) -> Option<&Lender> {
        self.lane.as_ref().map(|l| &l.lender)
    }

    /// Keeps `keep` until the peer releases the lent range `r` (or the connection ends): call
    /// it right after `send_*_shm(.., r, ..)` with a `Bytes` view of the bytes lent, so the
    /// region cannot be written again meanwhile (see [`Lender::hold`]). `Err(keep)` when `r`
    /// is not lent (the lane is off, or the send failed).
    pub fn shm_hold(&mut self, r: ShmRange, keep: bytes::Bytes) -> Result<(), bytes::Bytes> {
        match self.lane.as_mut() {
            Some(lane) => lane.lender.hold(r, keep),
            None => Err(keep),
        }
    }

    /// The driver's mapper for the peer's regions: called for each SHM_REGION whose frame
    /// checks passed, it takes the oldest descriptor received and checks and maps it (20.5).
    /// Without one, a SHM_REGION is `SHM_BAD_DESCRIPTOR`.
    pub fn set_shm_mapper(&mut self, mapper: ShmMapper) {
        self.shm_mapper = MapperSlot(Some(mapper));
    }

    /// Called (on any thread) when a view of a received body is dropped and its SHM_RELEASE
    /// waits: wake the driver, which sends it with [`send_shm_releases`](Self::send_shm_releases).
    pub fn set_shm_release_waker(&mut self, wake: std::sync::Arc<dyn Fn() + Send + Sync>) {
        self.shm_releases.set_waker(wake);
    }

    /// `n` descriptors arrived with the bytes of a read (`SCM_RIGHTS`), queued by the driver
    /// for its mapper. More than 8 waiting, or any where the lane is off, fails the connection
    /// (`SHM_BAD_DESCRIPTOR`) at the next [`next_event`](Self::next_event); the driver closes
    /// the descriptors then.
    pub fn shm_descriptors_received(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        // The worker that offered the lane reads with recvmsg from its HELLO on: a region may
        // arrive in the same read as the WELCOME that turns the lane on.
        let before_welcome = self.role == Role::Worker
            && !self.is_open()
            && self
                .hello
                .as_ref()
                .is_some_and(|h| h.extensions.shm.is_some());
        let result = match self.lane.as_mut() {
            Some(lane) => lane.borrower.descriptors_received(n),
            None if before_welcome => {
                self.early_descriptors += n;
                if self.early_descriptors > MAX_QUEUED_DESCRIPTORS {
                    Err(err(
                        ErrorCode::ShmBadDescriptor,
                        0,
                        format!(
                            "{} descriptors waiting for a SHM_REGION",
                            self.early_descriptors
                        ),
                    ))
                } else {
                    Ok(())
                }
            }
            None => Err(lane_off_descriptors(n)),
        };
        if let Err(e) = result {
            self.descriptor_error.get_or_insert(e);
        }
    }

    pub(super) fn check_can_send_shm(&self, what: &str) -> Result<(), ProtocolError> {
        let refuse = |why: &str| {
            Err(err(
                ErrorCode::UnexpectedFrame,
                0,
                format!("cannot send {what}: {why}"),
            ))
        };
        if self.send_closed {
            return refuse("this side already sent GOODBYE or a fatal ERROR");
        }
        if !self.is_open() {
            return refuse("the handshake is not complete");
        }
        if self.lane.is_none() {
            return refuse("the shm lane is off");
        }
        if self.role == Role::Parent && self.goodbye {
            return refuse("the worker said GOODBYE");
        }
        Ok(())
    }

    /// Announce a region of `size` bytes: records it and writes its SHM_REGION; returns its id.
    /// The driver sends the region's descriptor with the write holding this frame's first byte
    /// (20.5). Refused: lane off or connection closed (`UNEXPECTED_FRAME`), or the region does
    /// not fit the window or the 64 live regions (`SHM_BAD_REGION`).
    pub fn send_shm_region(
        &mut self,
        size: u64,
        out: &mut impl FrameBuf,
    ) -> Result<u32, ProtocolError> {
        self.check_can_send_shm("SHM_REGION")?;
        let lane = self.lane.as_mut().expect("checked: the lane is on");
        let region = lane.lender.announce(size)?;
        let mut frame = Vec::with_capacity(32);
        ShmFrame::Region { region, size }.encode(0, &mut frame);
        out.put_slice(&frame);
        Ok(region)
    }

    /// Withdraw region `region` (none of it lent): writes SHM_RETIRE; the driver may then drop
    /// it. Refused with `SHM_BAD_RELEASE` while a range of it is lent or if it is not live.
    pub fn send_shm_retire(
        &mut self,
        region: u32,
        out: &mut impl FrameBuf,
    ) -> Result<(), ProtocolError> {
        self.check_can_send_shm("SHM_RETIRE")?;
        let lane = self.lane.as_mut().expect("checked: the lane is on");
        lane.lender.retire(region)?;
        let mut frame = Vec::with_capacity(24);
        ShmFrame::Retire { region }.encode(0, &mut frame);
        out.put_slice(&frame);
        Ok(())
    }

    /// Whether views of received bodies were dropped and their SHM_RELEASEs wait.
    pub fn has_shm_releases(&self) -> bool {
        !self.shm_releases.is_empty()
    }

    /// Write a SHM_RELEASE for every range whose last view was dropped; returns how many. When
    /// the connection can send nothing more they are dropped (the peer is gone or going).
    pub fn send_shm_releases(&mut self, out: &mut impl FrameBuf) -> usize {
        let ranges = self.shm_releases.take();
        if self.check_can_send_shm("SHM_RELEASE").is_err() {
            return 0;
        }
        let lane = self.lane.as_mut().expect("checked: the lane is on");
        let mut frame = Vec::with_capacity(40);
        let mut sent = 0;
        for r in ranges {
            // A range not held is impossible (each view releases once); skip it rather than
            // send the peer a release it would refuse.
            if lane.borrower.release(r).is_ok() {
                frame.clear();
                ShmFrame::Release(r).encode(0, &mut frame);
                out.put_slice(&frame);
                sent += 1;
            }
        }
        sent
    }

    /// Parent: [`send_request`](Self::send_request) with the body in shared memory: range `r`
    /// of one of this side's regions, which the driver has written. Writes the REQUEST (`MORE`,
    /// its prefix only) and the SHM_BODY that lends `r` (20.3); returns the id. Refused as
    /// `send_request` is, and with `SHM_BOUNDS` for a range not in a live region or above the
    /// window (nothing written, nothing lent).
    pub fn send_request_shm(
        &mut self,
        method: u16,
        codec: u8,
        timeout_us: u64,
        r: ShmRange,
        out: &mut impl FrameBuf,
    ) -> Result<u64, ProtocolError> {
        self.check_can_send_shm("SHM_BODY")?;
        let id = self.highest_id + 1;
        let head = MessageHead::Request {
            method,
            codec,
            timeout_us,
        };
        let kind = self.check_request(id, method, shm_message_len(head, r))?;
        self.write_shm_message(id, head, r, out)?;
        self.record_request(id, kind);
        Ok(id)
    }

    /// Worker: [`send_result`](Self::send_result) with the body in range `r` of one of this
    /// side's regions (see [`send_request_shm`](Self::send_request_shm)). Ends the request.
    pub fn send_result_shm(
        &mut self,
        id: u64,
        r: ShmRange,
        out: &mut impl FrameBuf,
    ) -> Result<(), ProtocolError> {
        self.send_terminal_shm(id, MessageHead::Result, r, out)
    }

    /// Worker: [`send_end`](Self::send_end) with the summary in range `r` of one of this
    /// side's regions. Ends the request.
    pub fn send_end_shm(
        &mut self,
        id: u64,
        r: ShmRange,
        out: &mut impl FrameBuf,
    ) -> Result<(), ProtocolError> {
        let row_count = self.requests.get(&id).map_or(0, |q| q.rows);
        self.send_terminal_shm(id, MessageHead::End { row_count }, r, out)
    }

    pub(super) fn send_terminal_shm(
        &mut self,
        id: u64,
        head: MessageHead,
        r: ShmRange,
        out: &mut impl FrameBuf,
    ) -> Result<(), ProtocolError> {
        self.check_can_send_shm("SHM_BODY")?;
        let ty = head.frame_type();
        self.check_can_send(ty, id)?;
        self.check_message_size(id, shm_message_len(head, r))?;
        self.terminal_state(id, ty)?;
        self.write_shm_message(id, head, r, out)?;
        self.requests.remove(&id);
        Ok(())
    }

    /// Lends `r` (the last check) and writes the first frame (`MORE`, prefix only) and the
    /// SHM_BODY.
    pub(super) fn write_shm_message(
        &mut self,
        id: u64,
        head: MessageHead,
        r: ShmRange,
        out: &mut impl FrameBuf,
    ) -> Result<(), ProtocolError> {
        let lane = self.lane.as_mut().expect("checked: the lane is on");
        lane.lender.lend(r).map_err(|mut e| {
            e.id = id;
            e
        })?;
        let mut frames = Vec::with_capacity(2 * crate::HEADER_LEN + 24 + head.prefix_len());
        put_header(&mut frames, head.frame_type(), true, id, head.prefix_len())?;
        head.put_prefix(&mut frames);
        ShmFrame::Body(r).encode(id, &mut frames);
        out.put_slice(&frames);
        Ok(())
    }
}
