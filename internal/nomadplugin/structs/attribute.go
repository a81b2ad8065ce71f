// Package structs holds the values shared by Nomad's driver and device
// plugin protocols: typed attributes (fingerprints), statistics, and the
// recoverable error a plugin returns when a call may be retried.
package structs

import (
	"fmt"
	"strconv"

	structspb "github.com/oasis-llm/oasis/internal/nomadplugin/proto/structs"
)

// Attribute is one typed fingerprint value; exactly one of the value
// fields is set. Unit applies to numbers.
type Attribute struct {
	Float  *float64
	Int    *int64
	String *string
	Bool   *bool
	Unit   string
}

// NewStringAttribute returns a string attribute.
func NewStringAttribute(s string) *Attribute { return &Attribute{String: &s} }

// NewBoolAttribute returns a boolean attribute.
func NewBoolAttribute(b bool) *Attribute { return &Attribute{Bool: &b} }

// NewIntAttribute returns an integer attribute with a unit ("" for none).
func NewIntAttribute(i int64, unit string) *Attribute { return &Attribute{Int: &i, Unit: unit} }

// NewFloatAttribute returns a float attribute with a unit ("" for none).
func NewFloatAttribute(f float64, unit string) *Attribute { return &Attribute{Float: &f, Unit: unit} }

// GoString renders the value and unit, for logs and tools.
func (a *Attribute) GoString() string {
	if a == nil {
		return ""
	}
	var s string
	switch {
	case a.String != nil:
		s = *a.String
	case a.Int != nil:
		s = strconv.FormatInt(*a.Int, 10)
	case a.Float != nil:
		s = strconv.FormatFloat(*a.Float, 'f', -1, 64)
	case a.Bool != nil:
		s = strconv.FormatBool(*a.Bool)
	default:
		return ""
	}
	if a.Unit != "" {
		s += " " + a.Unit
	}
	return s
}

// AttributeToProto converts an attribute for the wire; nil stays nil.
func AttributeToProto(a *Attribute) *structspb.Attribute {
	if a == nil {
		return nil
	}
	out := &structspb.Attribute{Unit: a.Unit}
	switch {
	case a.Float != nil:
		out.Value = &structspb.Attribute_FloatVal{FloatVal: *a.Float}
	case a.Int != nil:
		out.Value = &structspb.Attribute_IntVal{IntVal: *a.Int}
	case a.String != nil:
		out.Value = &structspb.Attribute_StringVal{StringVal: *a.String}
	case a.Bool != nil:
		out.Value = &structspb.Attribute_BoolVal{BoolVal: *a.Bool}
	}
	return out
}

// AttributeFromProto converts an attribute from the wire; nil stays nil.
func AttributeFromProto(pb *structspb.Attribute) *Attribute {
	if pb == nil {
		return nil
	}
	out := &Attribute{Unit: pb.GetUnit()}
	switch v := pb.GetValue().(type) {
	case *structspb.Attribute_FloatVal:
		out.Float = &v.FloatVal
	case *structspb.Attribute_IntVal:
		out.Int = &v.IntVal
	case *structspb.Attribute_StringVal:
		out.String = &v.StringVal
	case *structspb.Attribute_BoolVal:
		out.Bool = &v.BoolVal
	}
	return out
}

// AttributesToProto converts a map of attributes for the wire.
func AttributesToProto(in map[string]*Attribute) map[string]*structspb.Attribute {
	if len(in) == 0 {
		return nil
	}
	out := make(map[string]*structspb.Attribute, len(in))
	for k, v := range in {
		out[k] = AttributeToProto(v)
	}
	return out
}

// AttributesFromProto converts a map of attributes from the wire.
func AttributesFromProto(in map[string]*structspb.Attribute) map[string]*Attribute {
	if len(in) == 0 {
		return nil
	}
	out := make(map[string]*Attribute, len(in))
	for k, v := range in {
		out[k] = AttributeFromProto(v)
	}
	return out
}

var _ fmt.GoStringer = (*Attribute)(nil)
