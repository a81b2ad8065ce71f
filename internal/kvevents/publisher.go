package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/hashicorp/go-hclog"
)

// DefaultBufferSize is how many batches a Publisher keeps for replay (vLLM's
// buffer_steps default).
const DefaultBufferSize = 10000

// endSeq is the replay stream's end marker: -1 as 8 big-endian bytes.
const endSeq = "\xff\xff\xff\xff\xff\xff\xff\xff"

// PublisherConfig mirrors vLLM's KVEventsConfig fields that matter on the wire.
type PublisherConfig struct {
	// Endpoint is the PUB socket's bind address, e.g. "tcp://*:5557" (all interfaces,
	// as vLLM binds) or "tcp://127.0.0.1:0" (kernel-chosen port; see Addr).
	Endpoint string
	// ReplayEndpoint, when set, binds a ROUTER socket serving replay requests.
	ReplayEndpoint string
	// Topic is sent as the first frame of every message ("" by default, as in vLLM).
	Topic string
	// BufferSize is how many recent batches are kept for replay (DefaultBufferSize if 0).
	BufferSize int
	// Layout selects the event encoding (LayoutMap by default).
	Layout Layout
	Logger hclog.Logger
}

type buffered struct {
	seq     int64
	payload []byte
}

// Publisher publishes EventBatches on a ZMQ PUB socket with vLLM's framing and,
// while Run runs, serves replays of recent batches. Safe for concurrent use.
type Publisher struct {
	cfg    PublisherConfig
	log    hclog.Logger
	cancel context.CancelFunc // ends the PUB socket's context
	pub    zmq4.Socket
	// replay's context ends with Run's or at Close.
	replay       zmq4.Socket
	replayCtx    context.Context
	replayCancel context.CancelFunc
	wg           sync.WaitGroup // Run

	mu     sync.Mutex
	seq    int64
	ring   []buffered // circular, oldest at head
	head   int
	closed bool
}

// NewPublisher binds the PUB socket (and the replay ROUTER socket if configured);
// Run serves the replays. Close releases both.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	if cfg.BufferSize <= 0 {
		cfg.BufferSize = DefaultBufferSize
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Publisher{cfg: cfg, log: cfg.Logger, cancel: cancel}
	p.replayCtx, p.replayCancel = context.WithCancel(context.Background())
	p.pub = zmq4.NewPub(ctx)
	if err := p.pub.Listen(cfg.Endpoint); err != nil {
		p.closeSockets()
		return nil, fmt.Errorf("binding kv-events endpoint %q: %w", cfg.Endpoint, err)
	}
	if cfg.ReplayEndpoint == "" {
		return p, nil
	}
	p.replay = zmq4.NewRouter(p.replayCtx, zmq4.WithTimeout(5*time.Second))
	if err := p.replay.Listen(cfg.ReplayEndpoint); err != nil {
		p.closeSockets()
		return nil, fmt.Errorf("binding kv-events replay endpoint %q: %w", cfg.ReplayEndpoint, err)
	}
	return p, nil
}

// Run serves replay requests until ctx ends or the publisher closes; without a
// replay endpoint it returns at once. Publishing does not need it.
func (p *Publisher) Run(ctx context.Context) error {
	if p.replay == nil {
		return nil
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.wg.Add(1)
	p.mu.Unlock()
	defer p.wg.Done()
	stop := context.AfterFunc(ctx, p.replayCancel)
	defer stop()
	p.serveReplay()
	return nil
}

// Addr is the PUB socket's bound address (useful with port 0).
func (p *Publisher) Addr() net.Addr { return p.pub.Addr() }

// ReplayAddr is the replay socket's bound address, nil without one.
func (p *Publisher) ReplayAddr() net.Addr {
	if p.replay == nil {
		return nil
	}
	return p.replay.Addr()
}

// Publish encodes b, assigns it the next sequence number (from 0) and sends it.
func (p *Publisher) Publish(b EventBatch) (int64, error) {
	payload, err := Encode(b, p.cfg.Layout)
	if err != nil {
		return 0, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, errors.New("kv-events publisher closed")
	}
	seq := p.seq
	p.seq++
	entry := buffered{seq: seq, payload: payload}
	if len(p.ring) < p.cfg.BufferSize {
		p.ring = append(p.ring, entry)
	} else {
		p.ring[p.head] = entry
		p.head = (p.head + 1) % len(p.ring)
	}
	var seqb [8]byte
	binary.BigEndian.PutUint64(seqb[:], uint64(seq))
	// zmq4's PUB queues the message and drops it for slow subscribers past its high-water
	// mark, as ZMQ does; Send only fails once the socket is closed.
	if err := p.pub.SendMulti(zmq4.NewMsgFrom([]byte(p.cfg.Topic), seqb[:], payload)); err != nil {
		return seq, fmt.Errorf("publishing kv events: %w", err)
	}
	return seq, nil
}

func (p *Publisher) serveReplay() {
	for {
		msg, err := p.replay.Recv()
		if err != nil {
			if p.replayCtx.Err() != nil {
				return
			}
			p.log.Debug("kv-events replay receive failed", "error", err)
			continue
		}
		if len(msg.Frames) != 3 || len(msg.Frames[2]) != 8 {
			p.log.Warn("invalid kv-events replay request", "frames", len(msg.Frames))
			continue
		}
		id := msg.Frames[0]
		start := int64(binary.BigEndian.Uint64(msg.Frames[2]))
		p.mu.Lock()
		var out []buffered
		for i := range p.ring {
			e := p.ring[(p.head+i)%len(p.ring)]
			if e.seq >= start {
				out = append(out, e)
			}
		}
		p.mu.Unlock()
		for _, e := range out {
			var seqb [8]byte
			binary.BigEndian.PutUint64(seqb[:], uint64(e.seq))
			if err := p.replay.SendMulti(zmq4.NewMsgFrom(id, nil, seqb[:], e.payload)); err != nil {
				p.log.Debug("kv-events replay send failed", "error", err)
				break
			}
		}
		if err := p.replay.SendMulti(zmq4.NewMsgFrom(id, nil, []byte(endSeq), nil)); err != nil {
			p.log.Debug("kv-events replay send failed", "error", err)
		}
	}
}

// Close stops publishing and closes the sockets.
func (p *Publisher) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	err := p.closeSockets()
	p.wg.Wait()
	return err
}

// closeSockets ends the sockets' contexts and closes them.
func (p *Publisher) closeSockets() error {
	p.cancel()
	p.replayCancel()
	err := p.pub.Close()
	if p.replay != nil {
		err = errors.Join(err, p.replay.Close())
	}
	return err
}
