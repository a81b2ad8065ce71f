package config

import (
	"fmt"
	"strconv"

	"github.com/hashicorp/go-msgpack/codec"
)

// Float is a number attribute of the task config. Nomad's client hands the driver its config
// encoded with cty's msgpack encoding, which sends a decimal that float64 cannot hold exactly
// (0.9, 0.85) as a string; a plain float64 field fails to decode it, so every fractional
// gpu_memory_utilization would fail the task. Float accepts both forms.
type Float float64

// CodecDecodeSelf implements codec.Selfer.
func (f *Float) CodecDecodeSelf(dec *codec.Decoder) {
	var v any
	dec.MustDecode(&v)
	switch x := v.(type) {
	case nil:
		*f = 0
	case float64:
		*f = Float(x)
	case float32:
		*f = Float(x)
	case int64:
		*f = Float(x)
	case uint64:
		*f = Float(x)
	case string:
		n, err := strconv.ParseFloat(x, 64)
		if err != nil {
			// The codec turns a panic in a Selfer into the decode error.
			panic(fmt.Errorf("decoding number %q: %w", x, err))
		}
		*f = Float(n)
	case []byte:
		n, err := strconv.ParseFloat(string(x), 64)
		if err != nil {
			panic(fmt.Errorf("decoding number %q: %w", x, err))
		}
		*f = Float(n)
	default:
		panic(fmt.Errorf("decoding number: unexpected %T", v))
	}
}

// CodecEncodeSelf implements codec.Selfer.
func (f *Float) CodecEncodeSelf(enc *codec.Encoder) { enc.MustEncode(float64(*f)) }
