package proto

// Send sends any single frame with every check of the typed operations, plus those only a frame
// given whole can break: an explicit REQUEST id (DUPLICATE_ID), END's row_count
// (ROW_COUNT_MISMATCH), a frame above max_frame_size (FRAME_TOO_LARGE), MORE and CONTINUATION
// by hand. For tests, fuzzing and the vectors; drivers use the typed operations. The frame is
// written as given (an ERROR is not fitted).
func (c *Connection) Send(f Frame) error {
	switch f := f.(type) {
	case *Hello:
		return c.SendHello(f)
	case *Welcome:
		return c.SendWelcome(f)
	case *Cancel:
		return c.SendCancel(f.ID)
	case *Credit:
		return c.SendCredit(f.ID, f.Bytes)
	case *Drain:
		return c.SendDrain(f.GraceMs)
	case *ErrorFrame:
		return c.sendError(f.ID, f.Code, f.Message, f.Details, false)
	case *Notification:
		return c.SendEvent(f.ID, f.Topic, f.Data)
	case *Ping:
		return c.SendPing(f.Nonce)
	case *Pong:
		return c.SendPong(f.Nonce)
	case *Goodbye:
		return c.SendGoodbye(f.Reason)
	case *Request:
		return c.sendRequestFrame(f)
	case *Continuation:
		return c.sendContinuation(f)
	case *Result, *End, *Rows:
		return c.sendWorkerFrame(f)
	}
	return refuse(CodeUnexpectedFrame, "cannot send %T", f)
}

func (c *Connection) frameFits(f Frame) error {
	if n, limit := PayloadLen(f), c.sendLimit(); n > limit {
		return refuse(CodeFrameTooLarge, "%s payload of %d bytes above max_frame_size %d", f.Type(), n, limit)
	}
	return nil
}

func (c *Connection) write(f Frame) error {
	b, err := AppendFrame(c.out, f)
	if err != nil {
		return err
	}
	c.out = b
	return nil
}

func (c *Connection) sendRequestFrame(f *Request) error {
	if err := c.checkSend(TypeRequest, f.ID); err != nil {
		return err
	}
	if f.ID == 0 {
		return refuse(CodeBadID, "REQUEST with id 0")
	}
	if f.ID <= c.highest {
		return refuse(CodeDuplicateID, "REQUEST id %d not above %d", f.ID, c.highest)
	}
	if c.draining {
		return refuse(CodeDraining, "no REQUEST can be sent after DRAIN")
	}
	if int(f.Method) >= len(c.hello.Methods) {
		return refuse(CodeUnknownMethod, "method index %d not in the worker's HELLO (%d methods)", f.Method, len(c.hello.Methods))
	}
	if err := c.checkMessageSize("request body", PayloadLen(f)); err != nil {
		return err
	}
	if len(c.reqs) >= int(c.welcome.MaxInFlight) {
		return refuse(CodeOverloaded, "%d requests already in flight (max_in_flight %d)", len(c.reqs), c.welcome.MaxInFlight)
	}
	if err := c.frameFits(f); err != nil {
		return err
	}
	if err := c.write(f); err != nil {
		return err
	}
	c.highest = f.ID
	c.reqs[f.ID] = c.newRequest(c.hello.Methods[f.Method].Kind)
	if f.More {
		c.outbound[f.ID] = &outMsg{typ: TypeRequest, manual: true, size: PayloadLen(f)}
	}
	return nil
}

func (c *Connection) sendContinuation(f *Continuation) error {
	if err := c.checkSend(TypeContinuation, f.ID); err != nil {
		return err
	}
	o := c.outbound[f.ID]
	if o == nil || !o.manual {
		return refuse(CodeContinuation, "CONTINUATION for id %d with no message of it being sent by hand", f.ID)
	}
	if err := c.checkMessageSize(o.typ.String(), o.size+len(f.Body)); err != nil {
		return err
	}
	if err := c.frameFits(f); err != nil {
		return err
	}
	if err := c.write(f); err != nil {
		return err
	}
	o.size += len(f.Body)
	if !f.More {
		c.finishOutbound(f.ID, o)
	}
	return nil
}

func (c *Connection) sendWorkerFrame(f Frame) error {
	t, id := f.Type(), f.RequestID()
	if err := c.checkSend(t, id); err != nil {
		return err
	}
	req, err := c.inFlightFor(t, id)
	if err != nil {
		return err
	}
	wantKind := KindStream
	if t == TypeResult {
		wantKind = KindUnary
	}
	if req.kind != wantKind {
		return refuse(CodeKindMismatch, "%s for a %s request %d", t, req.kind, id)
	}
	n := PayloadLen(f)
	switch f := f.(type) {
	case *Rows:
		if req.credit <= 0 {
			return refuse(CodeFlowControl, "ROWS for stream %d while its credit is %d", id, req.credit)
		}
		if len(f.Rows) == 0 {
			return refuse(CodeRowBounds, "a ROWS frame needs at least one row")
		}
	case *End:
		if f.RowCount != req.rows {
			return refuse(CodeRowCountMismatch, "END says %d rows, %d were sent", f.RowCount, req.rows)
		}
	}
	if err := c.checkMessageSize(t.String(), n); err != nil {
		return err
	}
	if err := c.frameFits(f); err != nil {
		return err
	}
	if err := c.write(f); err != nil {
		return err
	}
	switch f := f.(type) {
	case *Rows:
		req.credit -= int64(n)
		req.rows += uint64(len(f.Rows))
	default:
		if f.HasMore() {
			c.outbound[id] = &outMsg{typ: t, manual: true, size: n}
		} else {
			delete(c.reqs, id)
		}
	}
	return nil
}
