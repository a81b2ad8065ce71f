package structs

import (
	"google.golang.org/protobuf/types/known/wrapperspb"

	structspb "github.com/oasis-llm/oasis/internal/nomadplugin/proto/structs"
)

// StatValue is one statistic: a number, optionally a fraction
// (numerator/denominator, as used for "used of total"), a string or a
// boolean, with its unit and description.
type StatValue struct {
	FloatNumeratorVal   *float64
	FloatDenominatorVal *float64
	IntNumeratorVal     *int64
	IntDenominatorVal   *int64
	StringVal           *string
	BoolVal             *bool
	Unit                string
	Desc                string
}

// StatObject is a tree of named statistics.
type StatObject struct {
	Nested     map[string]*StatObject
	Attributes map[string]*StatValue
}

// StatValueToProto converts a statistic for the wire; nil stays nil.
func StatValueToProto(v *StatValue) *structspb.StatValue {
	if v == nil {
		return nil
	}
	out := &structspb.StatValue{Unit: v.Unit, Desc: v.Desc}
	if v.FloatNumeratorVal != nil {
		out.FloatNumeratorVal = wrapperspb.Double(*v.FloatNumeratorVal)
	}
	if v.FloatDenominatorVal != nil {
		out.FloatDenominatorVal = wrapperspb.Double(*v.FloatDenominatorVal)
	}
	if v.IntNumeratorVal != nil {
		out.IntNumeratorVal = wrapperspb.Int64(*v.IntNumeratorVal)
	}
	if v.IntDenominatorVal != nil {
		out.IntDenominatorVal = wrapperspb.Int64(*v.IntDenominatorVal)
	}
	if v.StringVal != nil {
		out.StringVal = wrapperspb.String(*v.StringVal)
	}
	if v.BoolVal != nil {
		out.BoolVal = wrapperspb.Bool(*v.BoolVal)
	}
	return out
}

// StatValueFromProto converts a statistic from the wire; nil stays nil.
func StatValueFromProto(pb *structspb.StatValue) *StatValue {
	if pb == nil {
		return nil
	}
	out := &StatValue{Unit: pb.GetUnit(), Desc: pb.GetDesc()}
	if w := pb.GetFloatNumeratorVal(); w != nil {
		f := w.GetValue()
		out.FloatNumeratorVal = &f
	}
	if w := pb.GetFloatDenominatorVal(); w != nil {
		f := w.GetValue()
		out.FloatDenominatorVal = &f
	}
	if w := pb.GetIntNumeratorVal(); w != nil {
		i := w.GetValue()
		out.IntNumeratorVal = &i
	}
	if w := pb.GetIntDenominatorVal(); w != nil {
		i := w.GetValue()
		out.IntDenominatorVal = &i
	}
	if w := pb.GetStringVal(); w != nil {
		s := w.GetValue()
		out.StringVal = &s
	}
	if w := pb.GetBoolVal(); w != nil {
		b := w.GetValue()
		out.BoolVal = &b
	}
	return out
}

// StatObjectToProto converts a statistics tree for the wire.
func StatObjectToProto(o *StatObject) *structspb.StatObject {
	if o == nil {
		return nil
	}
	out := &structspb.StatObject{}
	if len(o.Nested) > 0 {
		out.Nested = make(map[string]*structspb.StatObject, len(o.Nested))
		for k, v := range o.Nested {
			out.Nested[k] = StatObjectToProto(v)
		}
	}
	if len(o.Attributes) > 0 {
		out.Attributes = make(map[string]*structspb.StatValue, len(o.Attributes))
		for k, v := range o.Attributes {
			out.Attributes[k] = StatValueToProto(v)
		}
	}
	return out
}

// StatObjectFromProto converts a statistics tree from the wire.
func StatObjectFromProto(pb *structspb.StatObject) *StatObject {
	if pb == nil {
		return nil
	}
	out := &StatObject{}
	if len(pb.GetNested()) > 0 {
		out.Nested = make(map[string]*StatObject, len(pb.GetNested()))
		for k, v := range pb.GetNested() {
			out.Nested[k] = StatObjectFromProto(v)
		}
	}
	if len(pb.GetAttributes()) > 0 {
		out.Attributes = make(map[string]*StatValue, len(pb.GetAttributes()))
		for k, v := range pb.GetAttributes() {
			out.Attributes[k] = StatValueFromProto(v)
		}
	}
	return out
}
