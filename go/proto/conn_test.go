package proto

import (
	"errors"
	"testing"
)

func TestPingJumpsTheQueueAtAFrameBoundary(t *testing.T) {
	p := openParent(t, 1<<20)
	body := make([]byte, 200_000) // four frames at max_frame_size 65,536
	if _, err := p.SendRequest(0, 0, 0, body); err != nil {
		t.Fatal(err)
	}
	first := p.TakeOutput(1) // the first whole frame only
	if len(first) != HeaderSize+65536 {
		t.Fatalf("took %d bytes, want one whole frame", len(first))
	}
	if err := p.SendPing([8]byte{1}); err != nil {
		t.Fatal(err)
	}
	rest := p.TakeOutput(-1)
	if FrameType(rest[4]) != TypePing || FrameType(rest[HeaderSize+8+4]) != TypeContinuation {
		t.Fatalf("PING not at the next frame boundary: types %x, %x", rest[4], rest[HeaderSize+8+4])
	}
}

func TestRowsBuilderChargesCredit(t *testing.T) {
	w := openWorker(t, 65536, 100)
	if _, err := w.NextEvent(); err != nil {
		t.Fatal(err)
	}
	req, _ := AppendFrame(nil, &Request{ID: 1, Method: 1, Codec: 1})
	w.Receive(req)
	if ev, err := w.NextEvent(); err != nil || ev.(*Request).ID != 1 {
		t.Fatalf("%v %v", ev, err)
	}
	b, err := w.Rows(1)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := b.Append(make([]byte, 200)); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if err := b.Finish(); err != nil {
		t.Fatal(err)
	}
	if cr, _ := w.Credit(1); cr != 100-208 {
		t.Fatalf("credit %d", cr)
	}
	if _, err := w.Rows(1); !errors.Is(err, ErrFlowControl) {
		t.Fatalf("ROWS without credit: %v", err)
	}
	if _, err := b.Append(make([]byte, 65536)); !errors.Is(err, ErrRowTooLarge) {
		t.Fatalf("a row above the frame: %v", err)
	}
	if err := w.SendEnd(1, nil); err != nil {
		t.Fatal(err)
	}
	d := NewDecoder(65536)
	d.Write(w.TakeOutput(-1))
	if f, _, _ := d.Next(); len(f.(*Rows).Rows) != 1 {
		t.Fatal("no ROWS")
	}
	if f, _, _ := d.Next(); f.(*End).RowCount != 1 {
		t.Fatal("END row_count not filled by the core")
	}
	if err := w.SendResult(1, nil); !errors.Is(err, ErrUnknownID) {
		t.Fatalf("a second terminal: %v", err)
	}
}

func TestRefusedSendsChangeNothing(t *testing.T) {
	p := NewConnection(Parent)
	if _, err := p.SendRequest(0, 0, 0, nil); !errors.Is(err, ErrUnexpectedFrame) {
		t.Fatalf("REQUEST before the handshake: %v", err)
	}
	p = openParent(t, 1000)
	if _, err := p.SendRequest(9, 0, 0, nil); !errors.Is(err, ErrUnknownMethod) {
		t.Fatalf("unknown method: %v", err)
	}
	if err := p.SendDrain(0); err != nil {
		t.Fatal(err)
	}
	if _, err := p.SendRequest(9, 0, 0, nil); !errors.Is(err, ErrDraining) {
		t.Fatalf("DRAINING comes before UNKNOWN_METHOD: %v", err)
	}
	if p.InFlight() != 0 || p.OutputLen() != 20 {
		t.Fatalf("a refusal changed state: %d in flight, %d bytes out", p.InFlight(), p.OutputLen())
	}
}

func TestReadBufferReceivesALargeFrameInOneRead(t *testing.T) {
	w := openWorker(t, 1<<20, 1000)
	if _, err := w.NextEvent(); err != nil {
		t.Fatal(err)
	}
	frame, _ := AppendFrame(nil, &Request{ID: 1, Method: 0, Codec: 0, Body: make([]byte, 500_000)})
	buf := w.ReadBuffer(16)
	n := copy(buf, frame[:16])
	w.Received(n)
	if ev, err := w.NextEvent(); ev != nil || err != nil {
		t.Fatal(ev, err)
	}
	buf = w.ReadBuffer(1)
	if len(buf) < len(frame)-16 {
		t.Fatalf("ReadBuffer offers %d bytes for a frame of %d", len(buf), len(frame))
	}
	w.Received(copy(buf, frame[16:]))
	if ev, err := w.NextEvent(); err != nil || len(ev.(*Request).Body) != 500_000 {
		t.Fatal(ev, err)
	}
}
