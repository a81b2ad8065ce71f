// Package hclspec builds the HCL specifications a Nomad plugin publishes for
// its configuration and its tasks' configuration, and decodes
// configurations against them the way Nomad's client does (Convert,
// Decode, Encode), so that tests and tools see what a driver will receive.
package hclspec

import (
	hclspecpb "github.com/oasis-llm/oasis/internal/nomadplugin/proto/hclspec"
)

// Spec is one node of a specification tree, as sent on the wire.
type Spec = hclspecpb.Spec

// NewObject is an object whose properties are the given specs.
func NewObject(attrs map[string]*Spec) *Spec {
	return &Spec{Block: &hclspecpb.Spec_Object{Object: &hclspecpb.Object{Attributes: attrs}}}
}

// NewAttr is an attribute of the HCL type expression attrType.
func NewAttr(name, attrType string, required bool) *Spec {
	return &Spec{Block: &hclspecpb.Spec_Attr{Attr: &hclspecpb.Attr{Name: name, Type: attrType, Required: required}}}
}

// NewBlock is zero or one block (one when required) decoded with nested.
func NewBlock(name string, required bool, nested *Spec) *Spec {
	return &Spec{Block: &hclspecpb.Spec_BlockValue{BlockValue: &hclspecpb.Block{Name: name, Required: required, Nested: nested}}}
}

// NewBlockAttrs is a block whose attributes form a map of elementType.
func NewBlockAttrs(name, elementType string, required bool) *Spec {
	return &Spec{Block: &hclspecpb.Spec_BlockAttrs{BlockAttrs: &hclspecpb.BlockAttrs{Name: name, Type: elementType, Required: required}}}
}

// NewBlockList is any number of blocks, each decoded with nested, in order.
func NewBlockList(name string, nested *Spec) *Spec {
	return NewBlockListLimited(name, 0, 0, nested)
}

// NewBlockListLimited is NewBlockList with a minimum and maximum count (0:
// none).
func NewBlockListLimited(name string, minItems, maxItems uint64, nested *Spec) *Spec {
	return &Spec{Block: &hclspecpb.Spec_BlockList{BlockList: &hclspecpb.BlockList{Name: name, MinItems: minItems, MaxItems: maxItems, Nested: nested}}}
}

// NewBlockSet is NewBlockList without order or duplicates.
func NewBlockSet(name string, nested *Spec) *Spec {
	return &Spec{Block: &hclspecpb.Spec_BlockSet{BlockSet: &hclspecpb.BlockSet{Name: name, Nested: nested}}}
}

// NewBlockMap is labelled blocks keyed by their labels.
func NewBlockMap(name string, labels []string, nested *Spec) *Spec {
	return &Spec{Block: &hclspecpb.Spec_BlockMap{BlockMap: &hclspecpb.BlockMap{Name: name, Labels: labels, Nested: nested}}}
}

// NewLiteral is a constant, written as an HCL expression (`"30s"`, `false`).
func NewLiteral(value string) *Spec {
	return &Spec{Block: &hclspecpb.Spec_Literal{Literal: &hclspecpb.Literal{Value: value}}}
}

// NewDefault is primary's value, or defaultValue's when primary is unset.
func NewDefault(primary, defaultValue *Spec) *Spec {
	return &Spec{Block: &hclspecpb.Spec_Default{Default: &hclspecpb.Default{Primary: primary, Default: defaultValue}}}
}

// NewArray is a tuple of the values' results.
func NewArray(values []*Spec) *Spec {
	return &Spec{Block: &hclspecpb.Spec_Array{Array: &hclspecpb.Array{Values: values}}}
}
