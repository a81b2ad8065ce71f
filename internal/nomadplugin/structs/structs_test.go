package structs

import (
	"errors"
	"reflect"
	"testing"
)

func TestAttributeRoundTrip(t *testing.T) {
	for name, a := range map[string]*Attribute{
		"string": NewStringAttribute("NVIDIA H100"),
		"int":    NewIntAttribute(81559, "MiB"),
		"float":  NewFloatAttribute(700.5, "W"),
		"bool":   NewBoolAttribute(true),
		"nil":    nil,
	} {
		t.Run(name, func(t *testing.T) {
			if got := AttributeFromProto(AttributeToProto(a)); !reflect.DeepEqual(got, a) {
				t.Fatalf("round trip: got %#v want %#v", got, a)
			}
		})
	}
	if got := NewIntAttribute(3, "W").GoString(); got != "3 W" {
		t.Fatalf("GoString %q", got)
	}
}

func TestStatObjectRoundTrip(t *testing.T) {
	f, d, i, s, b := 1.5, 80.0, int64(7), "ok", true
	o := &StatObject{
		Attributes: map[string]*StatValue{
			"mem":  {FloatNumeratorVal: &f, FloatDenominatorVal: &d, Unit: "GiB", Desc: "memory"},
			"n":    {IntNumeratorVal: &i},
			"name": {StringVal: &s},
			"ok":   {BoolVal: &b},
		},
		Nested: map[string]*StatObject{"gpu0": {Attributes: map[string]*StatValue{"n": {IntNumeratorVal: &i, IntDenominatorVal: &i}}}},
	}
	if got := StatObjectFromProto(StatObjectToProto(o)); !reflect.DeepEqual(got, o) {
		t.Fatalf("round trip: got %#v", got)
	}
}

func TestRecoverableErrorOverGRPC(t *testing.T) {
	for _, rec := range []bool{true, false} {
		err := GRPCStatusError(NewRecoverableError(errors.New("engine binary missing"), rec))
		back := ErrorFromGRPC(err)
		var re *RecoverableError
		if !errors.As(back, &re) || re.Recoverable != rec || IsRecoverable(back) != rec {
			t.Fatalf("recoverable=%v: got %#v", rec, back)
		}
		if re.Error() != "engine binary missing" {
			t.Fatalf("message %q", re.Error())
		}
	}
	plain := errors.New("plain")
	if GRPCStatusError(plain) != plain || IsRecoverable(plain) {
		t.Fatal("a plain error must pass unchanged and not be recoverable")
	}
}
