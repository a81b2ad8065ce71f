package tinymodel

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
)

// GGUF version 3, little-endian (ggml/include/gguf.h, docs/gguf.md of llama.cpp).
const (
	ggufMagic     = 0x46554747 // "GGUF"
	ggufVersion   = 3
	ggufAlignment = 32
)

// Value types of a GGUF key.
const (
	typeUint8   uint32 = 0
	typeInt8    uint32 = 1
	typeUint16  uint32 = 2
	typeInt16   uint32 = 3
	typeUint32  uint32 = 4
	typeInt32   uint32 = 5
	typeFloat32 uint32 = 6
	typeBool    uint32 = 7
	typeString  uint32 = 8
	typeArray   uint32 = 9
	typeUint64  uint32 = 10
	typeInt64   uint32 = 11
	typeFloat64 uint32 = 12
)

// Tensor types this package writes.
const (
	TensorF32 uint32 = 0
	TensorF16 uint32 = 1
)

// KV is one metadata pair. Value is a uint32, int32, float32, bool, string, []string or
// []int32 for what this package writes; Read keeps any other type as it found it
// (Raw) so that it can be copied unchanged.
type KV struct {
	Key   string
	Value any
}

// Raw is a value of a type this package does not interpret: its type and encoded bytes.
type Raw struct {
	Type uint32
	Data []byte
}

// TensorInfo is a tensor's name, shape (ggml order: Dims[0] is the innermost,
// contiguous dimension) and type.
type TensorInfo struct {
	Name string
	Dims []uint64
	Type uint32
}

// Bytes is the size of the tensor's data.
func (t TensorInfo) Bytes() uint64 {
	n := uint64(1)
	for _, d := range t.Dims {
		n *= d
	}
	if t.Type == TensorF16 {
		return 2 * n
	}
	return 4 * n
}

// File is a GGUF file's metadata and tensor infos (not its tensor data).
type File struct {
	Version uint32
	KVs     []KV
	Tensors []TensorInfo
}

// Get returns the value of key, or nil.
func (f *File) Get(key string) any {
	for _, kv := range f.KVs {
		if kv.Key == key {
			return kv.Value
		}
	}
	return nil
}

type reader struct {
	r   *bufio.Reader
	err error
}

func (r *reader) read(n int) []byte {
	if r.err != nil {
		return nil
	}
	b := make([]byte, n)
	_, r.err = io.ReadFull(r.r, b)
	return b
}

func (r *reader) u32() uint32 {
	b := r.read(4)
	if r.err != nil {
		return 0
	}
	return binary.LittleEndian.Uint32(b)
}

func (r *reader) u64() uint64 {
	b := r.read(8)
	if r.err != nil {
		return 0
	}
	return binary.LittleEndian.Uint64(b)
}

// maxLen bounds a string or array length read from a file (a corrupt length must not
// allocate gigabytes).
const maxLen = 1 << 28

func (r *reader) str() string {
	n := r.u64()
	if r.err == nil && n > maxLen {
		r.err = fmt.Errorf("gguf: string of %d bytes", n)
	}
	return string(r.read(int(n)))
}

// scalarSize is the encoded size of a fixed-size value type; 0 for string and array.
func scalarSize(t uint32) int {
	switch t {
	case typeUint8, typeInt8, typeBool:
		return 1
	case typeUint16, typeInt16:
		return 2
	case typeUint32, typeInt32, typeFloat32:
		return 4
	case typeUint64, typeInt64, typeFloat64:
		return 8
	}
	return 0
}

func (r *reader) value(t uint32) any {
	switch t {
	case typeUint32:
		return r.u32()
	case typeInt32:
		return int32(r.u32())
	case typeFloat32:
		return math.Float32frombits(r.u32())
	case typeBool:
		b := r.read(1)
		return r.err == nil && b[0] != 0
	case typeString:
		return r.str()
	case typeArray:
		et, n := r.u32(), r.u64()
		if r.err == nil && n > maxLen {
			r.err = fmt.Errorf("gguf: array of %d elements", n)
			return nil
		}
		switch et {
		case typeString:
			s := make([]string, 0, n)
			for i := uint64(0); i < n && r.err == nil; i++ {
				s = append(s, r.str())
			}
			return s
		case typeInt32:
			s := make([]int32, n)
			for i := range s {
				s[i] = int32(r.u32())
			}
			return s
		}
		size := scalarSize(et)
		if size == 0 {
			r.err = fmt.Errorf("gguf: array of element type %d", et)
			return nil
		}
		var head [12]byte
		binary.LittleEndian.PutUint32(head[:4], et)
		binary.LittleEndian.PutUint64(head[4:], n)
		return Raw{Type: typeArray, Data: append(head[:], r.read(size*int(n))...)}
	}
	size := scalarSize(t)
	if size == 0 {
		r.err = fmt.Errorf("gguf: value type %d", t)
		return nil
	}
	return Raw{Type: t, Data: r.read(size)}
}

// Read parses a GGUF file's header, metadata and tensor infos.
func Read(rd io.Reader) (*File, error) {
	r := &reader{r: bufio.NewReaderSize(rd, 1<<20)}
	if m := r.u32(); r.err == nil && m != ggufMagic {
		return nil, errors.New("gguf: not a GGUF file")
	}
	f := &File{Version: r.u32()}
	if r.err == nil && f.Version != ggufVersion {
		return nil, fmt.Errorf("gguf: version %d (this reader knows %d)", f.Version, ggufVersion)
	}
	nt, nkv := r.u64(), r.u64()
	if r.err == nil && (nt > maxLen || nkv > maxLen) {
		return nil, fmt.Errorf("gguf: %d tensors, %d keys", nt, nkv)
	}
	for i := uint64(0); i < nkv && r.err == nil; i++ {
		k := r.str()
		f.KVs = append(f.KVs, KV{Key: k, Value: r.value(r.u32())})
	}
	for i := uint64(0); i < nt && r.err == nil; i++ {
		t := TensorInfo{Name: r.str()}
		nd := r.u32()
		if nd > 4 {
			return nil, fmt.Errorf("gguf: tensor %s has %d dimensions", t.Name, nd)
		}
		for j := uint32(0); j < nd; j++ {
			t.Dims = append(t.Dims, r.u64())
		}
		t.Type = r.u32()
		r.u64() // offset: tensors are laid out in order, aligned
		f.Tensors = append(f.Tensors, t)
	}
	if r.err != nil {
		return nil, fmt.Errorf("gguf: %w", r.err)
	}
	return f, nil
}

// writer accumulates a write error.
type writer struct {
	w   *bufio.Writer
	n   int64
	err error
}

func (w *writer) write(b []byte) {
	if w.err != nil {
		return
	}
	var n int
	n, w.err = w.w.Write(b)
	w.n += int64(n)
}

func (w *writer) u32(v uint32) { w.write(binary.LittleEndian.AppendUint32(nil, v)) }
func (w *writer) u64(v uint64) { w.write(binary.LittleEndian.AppendUint64(nil, v)) }
func (w *writer) str(s string) { w.u64(uint64(len(s))); w.write([]byte(s)) }

func (w *writer) kv(kv KV) {
	w.str(kv.Key)
	switch v := kv.Value.(type) {
	case uint32:
		w.u32(typeUint32)
		w.u32(v)
	case int32:
		w.u32(typeInt32)
		w.u32(uint32(v))
	case float32:
		w.u32(typeFloat32)
		w.u32(math.Float32bits(v))
	case bool:
		w.u32(typeBool)
		if v {
			w.write([]byte{1})
		} else {
			w.write([]byte{0})
		}
	case string:
		w.u32(typeString)
		w.str(v)
	case []string:
		w.u32(typeArray)
		w.u32(typeString)
		w.u64(uint64(len(v)))
		for _, s := range v {
			w.str(s)
		}
	case []int32:
		w.u32(typeArray)
		w.u32(typeInt32)
		w.u64(uint64(len(v)))
		for _, x := range v {
			w.u32(uint32(x))
		}
	case Raw:
		w.u32(v.Type)
		w.write(v.Data)
	default:
		if w.err == nil {
			w.err = fmt.Errorf("gguf: key %s: cannot write a %T", kv.Key, kv.Value)
		}
	}
}

func (w *writer) pad() {
	if r := w.n % ggufAlignment; r != 0 {
		w.write(make([]byte, ggufAlignment-r))
	}
}

func alignUp(n uint64) uint64 { return (n + ggufAlignment - 1) / ggufAlignment * ggufAlignment }

// write writes a GGUF file: header, metadata, tensor infos, then each tensor's data
// from data(i, w), which must write exactly Tensors[i].Bytes() bytes.
func write(out io.Writer, f *File, data func(i int, w io.Writer) error) error {
	w := &writer{w: bufio.NewWriterSize(out, 1<<20)}
	w.u32(ggufMagic)
	w.u32(ggufVersion)
	w.u64(uint64(len(f.Tensors)))
	w.u64(uint64(len(f.KVs)))
	for _, kv := range f.KVs {
		w.kv(kv)
	}
	var off uint64
	for _, t := range f.Tensors {
		w.str(t.Name)
		w.u32(uint32(len(t.Dims)))
		for _, d := range t.Dims {
			w.u64(d)
		}
		w.u32(t.Type)
		w.u64(off)
		off = alignUp(off + t.Bytes())
	}
	w.pad()
	for i, t := range f.Tensors {
		if w.err != nil {
			break
		}
		start := w.n
		if err := data(i, (*countingWriter)(w)); err != nil {
			return err
		}
		if w.err == nil && uint64(w.n-start) != t.Bytes() {
			return fmt.Errorf("gguf: tensor %s: wrote %d bytes, want %d", t.Name, w.n-start, t.Bytes())
		}
		w.pad()
	}
	if w.err != nil {
		return w.err
	}
	return w.w.Flush()
}

type countingWriter writer

func (c *countingWriter) Write(b []byte) (int, error) {
	w := (*writer)(c)
	w.write(b)
	if w.err != nil {
		return 0, w.err
	}
	return len(b), nil
}

// f16 converts a float32 to IEEE 754 half precision (round to nearest even; overflow
// to infinity, underflow through subnormals to zero).
func f16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23&0xff) - 127 + 15
	mant := b & 0x7fffff
	switch {
	case b&0x7fffffff == 0:
		return sign
	case exp >= 0x1f:
		if b>>23&0xff == 0xff && mant != 0 {
			return sign | 0x7e00 // NaN
		}
		return sign | 0x7c00
	case exp <= 0:
		if exp < -10 {
			return sign
		}
		mant |= 0x800000
		shift := uint32(14 - exp)
		half := mant >> shift
		rem := mant & (1<<shift - 1)
		mid := uint32(1) << (shift - 1)
		if rem > mid || (rem == mid && half&1 == 1) {
			half++
		}
		return sign | uint16(half)
	}
	half := uint32(exp)<<10 | mant>>13
	rem := mant & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && half&1 == 1) {
		half++ // may carry into the exponent: still correct, up to infinity
	}
	return sign | uint16(half)
}
