package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
	"github.com/hashicorp/go-hclog"
)

// Message is one received batch.
type Message struct {
	Topic string
	Seq   int64
	Batch EventBatch
	// Missed counts sequence numbers skipped since the previous message (lost to the
	// PUB socket's high-water mark or a reconnect): the subscriber's view of the engine's
	// cache may be stale by that many batches. Use Replay to fetch them.
	Missed int64
	// Restarted is set when Seq did not increase (the publisher restarted) or when the
	// subscriber had to re-establish its connection (the publisher may have restarted
	// and counted up to exactly the next sequence number, or messages were lost in
	// between). Either way every block previously reported by the publisher must be
	// treated as unknown.
	Restarted bool
}

// SubscriberConfig names the engine's endpoints.
type SubscriberConfig struct {
	// Endpoint is the engine's PUB endpoint to dial, e.g. "tcp://10.0.0.5:5557".
	Endpoint string
	// Topic filters by prefix; "" receives every topic.
	Topic string
	// ReplayEndpoint is the engine's replay ROUTER endpoint (optional, for Replay).
	ReplayEndpoint string
	Logger         hclog.Logger
}

// Subscriber receives EventBatches from one engine. While Run runs it dials and
// keeps redialing, so it may be created before the engine starts; Next returns
// what it received.
type Subscriber struct {
	cfg     SubscriberConfig
	log     hclog.Logger
	ctx     context.Context // the socket's; ends with Run's or at Close
	cancel  context.CancelFunc
	sub     zmq4.Socket
	msgs    chan recvd
	done    chan struct{} // closed when Run ends, or at Close without Run
	tracker *connTracker

	mu      sync.Mutex
	running bool
	closed  bool

	lastSeq   int64 // -1 before the first message; only touched by Next
	lastEpoch int64
}

type recvd struct {
	msg   Message
	epoch int64 // connections made when the message was received
	err   error
}

// connTracker counts the TCP connections a subscriber's socket has made.
// connTracker counts a subscriber's connections (epoch) and its dials that
// failed (refused: the engine is not up yet).
type connTracker struct{ epoch, refused atomic.Int64 }

type trackerKey struct{}

// trackedScheme is a zmq4 transport that dials TCP like "tcp" and counts connections
// for the subscriber found in the socket's context. zmq4 reconnects silently and
// exposes no connection events; counting dials is how a Subscriber learns of them.
const trackedScheme = "oasis-kvevents-tcp"

type trackingTransport struct{ tcp transport.Transport }

func (t trackingTransport) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	c, err := t.tcp.Dial(ctx, d, addr)
	if tr, ok := ctx.Value(trackerKey{}).(*connTracker); ok {
		if err == nil {
			tr.epoch.Add(1)
		} else {
			tr.refused.Add(1)
		}
	}
	return c, err
}

func (t trackingTransport) Listen(ctx context.Context, addr string) (net.Listener, error) {
	return t.tcp.Listen(ctx, addr)
}

func (t trackingTransport) Addr(ep string) (string, error) { return t.tcp.Addr(ep) }

// registerTransport adds trackedScheme to zmq4's process-wide transport registry,
// once (zmq4 keeps that registry global; nothing else here is).
var registerTransport = sync.OnceValue(func() error {
	return zmq4.RegisterTransport(trackedScheme, trackingTransport{tcp: transport.New("tcp")})
})

// NewSubscriber makes a subscriber; Run receives, Close stops it.
func NewSubscriber(cfg SubscriberConfig) (*Subscriber, error) {
	if cfg.Endpoint == "" {
		return nil, errors.New("kv-events subscriber: endpoint is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if err := registerTransport(); err != nil {
		return nil, fmt.Errorf("registering zmq transport: %w", err)
	}
	tracker := &connTracker{}
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), trackerKey{}, tracker))
	s := &Subscriber{
		cfg:     cfg,
		log:     cfg.Logger,
		ctx:     ctx,
		cancel:  cancel,
		sub:     zmq4.NewSub(ctx, zmq4.WithDialerMaxRetries(-1), zmq4.WithDialerRetry(200*time.Millisecond), zmq4.WithAutomaticReconnect(true)),
		msgs:    make(chan recvd, 1024),
		done:    make(chan struct{}),
		tracker: tracker,
		lastSeq: -1,
	}
	return s, nil
}

// Run dials the endpoint and receives batches for Next until ctx ends or
// Close; it returns nil then. Dial and subscription errors come out of Next.
func (s *Subscriber) Run(ctx context.Context) error {
	s.mu.Lock()
	if s.closed || s.running {
		s.mu.Unlock()
		return nil
	}
	s.running = true
	s.mu.Unlock()
	defer context.AfterFunc(ctx, s.cancel)()
	s.run(s.ctx)
	return nil
}

func (s *Subscriber) run(ctx context.Context) {
	defer close(s.done)
	endpoint := s.cfg.Endpoint
	if rest, ok := strings.CutPrefix(endpoint, "tcp://"); ok {
		endpoint = trackedScheme + "://" + rest
	}
	if err := s.sub.Dial(endpoint); err != nil {
		if ctx.Err() == nil {
			s.deliver(ctx, recvd{err: fmt.Errorf("dialing kv-events endpoint %q: %w", s.cfg.Endpoint, err)})
		}
		return
	}
	if err := s.sub.SetOption(zmq4.OptionSubscribe, s.cfg.Topic); err != nil {
		s.deliver(ctx, recvd{err: fmt.Errorf("subscribing to %q: %w", s.cfg.Topic, err)})
		return
	}
	for {
		m, err := s.sub.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			s.log.Debug("kv-events receive failed", "endpoint", s.cfg.Endpoint, "error", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		msg, err := parseFrames(m.Frames)
		if err != nil {
			// A malformed message is reported and skipped; the stream goes on.
			s.log.Warn("malformed kv-events message", "endpoint", s.cfg.Endpoint, "error", err)
			continue
		}
		if !s.deliver(ctx, recvd{msg: msg, epoch: s.tracker.epoch.Load()}) {
			return
		}
	}
}

func (s *Subscriber) deliver(ctx context.Context, r recvd) bool {
	select {
	case s.msgs <- r:
		return true
	case <-ctx.Done():
		return false
	}
}

func parseFrames(frames [][]byte) (Message, error) {
	if len(frames) != 3 {
		return Message{}, fmt.Errorf("got %d frames, want 3", len(frames))
	}
	if len(frames[1]) != 8 {
		return Message{}, fmt.Errorf("sequence frame has %d bytes, want 8", len(frames[1]))
	}
	b, err := Decode(frames[2])
	if err != nil {
		return Message{}, err
	}
	return Message{Topic: string(frames[0]), Seq: int64(binary.BigEndian.Uint64(frames[1])), Batch: b}, nil
}

// Next blocks until the next batch arrives, ctx ends, or the subscriber is closed.
func (s *Subscriber) Next(ctx context.Context) (Message, error) {
	select {
	case r, ok := <-s.msgs:
		if !ok {
			return Message{}, errors.New("kv-events subscriber closed")
		}
		if r.err != nil {
			return Message{}, r.err
		}
		m := r.msg
		if s.lastSeq >= 0 {
			switch {
			case m.Seq <= s.lastSeq:
				m.Restarted = true
			case m.Seq > s.lastSeq+1:
				m.Missed = m.Seq - s.lastSeq - 1
			}
			if r.epoch != s.lastEpoch {
				m.Restarted = true // reconnected since the previous message
			}
		}
		s.lastSeq, s.lastEpoch = m.Seq, r.epoch
		return m, nil
	case <-ctx.Done():
		return Message{}, ctx.Err()
	case <-s.done:
		// Drain what is left before reporting the end.
		select {
		case r := <-s.msgs:
			if r.err != nil {
				return Message{}, r.err
			}
			return r.msg, nil
		default:
		}
		return Message{}, errors.New("kv-events subscriber closed")
	}
}

// Replay fetches buffered batches with seq >= from from a replay endpoint.
func Replay(ctx context.Context, endpoint, topic string, from int64) ([]Message, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	dealer := zmq4.NewDealer(ctx, zmq4.WithDialerMaxRetries(3))
	defer dealer.Close()
	if err := dealer.Dial(endpoint); err != nil {
		return nil, fmt.Errorf("dialing kv-events replay endpoint %q: %w", endpoint, err)
	}
	var seqb [8]byte
	binary.BigEndian.PutUint64(seqb[:], uint64(from))
	if err := dealer.SendMulti(zmq4.NewMsgFrom(nil, seqb[:])); err != nil {
		return nil, fmt.Errorf("sending replay request: %w", err)
	}
	var out []Message
	for {
		m, err := dealer.Recv()
		if err != nil {
			return out, fmt.Errorf("receiving replay: %w", err)
		}
		// [empty delimiter, seq, payload]
		if len(m.Frames) != 3 || len(m.Frames[1]) != 8 {
			return out, fmt.Errorf("malformed replay message with %d frames", len(m.Frames))
		}
		seq := int64(binary.BigEndian.Uint64(m.Frames[1]))
		if seq == -1 {
			return out, nil
		}
		b, err := Decode(m.Frames[2])
		if err != nil {
			return out, fmt.Errorf("replayed batch %d: %w", seq, err)
		}
		out = append(out, Message{Topic: topic, Seq: seq, Batch: b})
	}
}

// Close stops the subscriber and waits for Run to end.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	running := s.running
	s.mu.Unlock()
	s.cancel()
	err := s.sub.Close()
	if running {
		<-s.done
	} else {
		close(s.done)
	}
	return err
}
