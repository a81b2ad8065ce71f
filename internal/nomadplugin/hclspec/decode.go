package hclspec

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/ext/typeexpr"
	"github.com/hashicorp/hcl/v2/hcldec"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	hcljson "github.com/hashicorp/hcl/v2/json"
	"github.com/zclconf/go-cty/cty"
	ctymsgpack "github.com/zclconf/go-cty/cty/msgpack"

	hclspecpb "github.com/oasis-llm/oasis/internal/nomadplugin/proto/hclspec"
)

// ErrInvalidSpec reports a specification that cannot be converted.
var ErrInvalidSpec = errors.New("invalid hcl spec")

// Convert turns a specification into the hcldec.Spec Nomad's client
// decodes configurations with.
func Convert(spec *Spec) (hcldec.Spec, error) {
	return convert(spec, "")
}

// convert converts one node; name is the property name an enclosing
// Object gives it, used when the node names none itself.
func convert(spec *Spec, name string) (hcldec.Spec, error) {
	switch b := spec.GetBlock().(type) {
	case *hclspecpb.Spec_Object:
		obj := hcldec.ObjectSpec{}
		for prop, nested := range b.Object.GetAttributes() {
			s, err := convert(nested, prop)
			if err != nil {
				return nil, err
			}
			obj[prop] = s
		}
		return obj, nil
	case *hclspecpb.Spec_Array:
		tuple := make(hcldec.TupleSpec, 0, len(b.Array.GetValues()))
		for _, v := range b.Array.GetValues() {
			s, err := convert(v, "")
			if err != nil {
				return nil, err
			}
			tuple = append(tuple, s)
		}
		return tuple, nil
	case *hclspecpb.Spec_Attr:
		return convertAttr(b.Attr, name)
	case *hclspecpb.Spec_BlockAttrs:
		t, err := parseType(b.BlockAttrs.GetType())
		if err != nil {
			return nil, fmt.Errorf("%w: block_attrs %q: %v", ErrInvalidSpec, b.BlockAttrs.GetName(), err)
		}
		return &hcldec.BlockAttrsSpec{TypeName: orName(b.BlockAttrs.GetName(), name), ElementType: t, Required: b.BlockAttrs.GetRequired()}, nil
	case *hclspecpb.Spec_Literal:
		return convertLiteral(b.Literal.GetValue())
	case *hclspecpb.Spec_Default:
		primary, err := convert(b.Default.GetPrimary(), name)
		if err != nil {
			return nil, err
		}
		def, err := convert(b.Default.GetDefault(), name)
		if err != nil {
			return nil, err
		}
		return &hcldec.DefaultSpec{Primary: primary, Default: def}, nil
	}
	return convertBlock(spec, name)
}

// convertBlock converts the block kinds, whose nested spec is required.
func convertBlock(spec *Spec, name string) (hcldec.Spec, error) {
	var (
		typeName string
		nested   *Spec
		build    func(n hcldec.Spec) hcldec.Spec
	)
	switch b := spec.GetBlock().(type) {
	case *hclspecpb.Spec_BlockValue:
		typeName, nested = orName(b.BlockValue.GetName(), name), b.BlockValue.GetNested()
		build = func(n hcldec.Spec) hcldec.Spec {
			return &hcldec.BlockSpec{TypeName: typeName, Required: b.BlockValue.GetRequired(), Nested: n}
		}
	case *hclspecpb.Spec_BlockList:
		typeName, nested = orName(b.BlockList.GetName(), name), b.BlockList.GetNested()
		build = func(n hcldec.Spec) hcldec.Spec {
			return &hcldec.BlockListSpec{TypeName: typeName, MinItems: int(b.BlockList.GetMinItems()), MaxItems: int(b.BlockList.GetMaxItems()), Nested: n}
		}
	case *hclspecpb.Spec_BlockSet:
		typeName, nested = orName(b.BlockSet.GetName(), name), b.BlockSet.GetNested()
		build = func(n hcldec.Spec) hcldec.Spec {
			return &hcldec.BlockSetSpec{TypeName: typeName, MinItems: int(b.BlockSet.GetMinItems()), MaxItems: int(b.BlockSet.GetMaxItems()), Nested: n}
		}
	case *hclspecpb.Spec_BlockMap:
		typeName, nested = orName(b.BlockMap.GetName(), name), b.BlockMap.GetNested()
		build = func(n hcldec.Spec) hcldec.Spec {
			return &hcldec.BlockMapSpec{TypeName: typeName, LabelNames: b.BlockMap.GetLabels(), Nested: n}
		}
	default:
		return nil, fmt.Errorf("%w: empty spec (property %q)", ErrInvalidSpec, name)
	}
	if typeName == "" {
		return nil, fmt.Errorf("%w: block without a name", ErrInvalidSpec)
	}
	if nested == nil {
		return nil, fmt.Errorf("%w: block %q has no nested spec", ErrInvalidSpec, typeName)
	}
	n, err := convert(nested, "")
	if err != nil {
		return nil, err
	}
	return build(n), nil
}

func convertAttr(a *hclspecpb.Attr, name string) (hcldec.Spec, error) {
	n := orName(a.GetName(), name)
	if n == "" {
		return nil, fmt.Errorf("%w: attribute without a name", ErrInvalidSpec)
	}
	t, err := parseType(a.GetType())
	if err != nil {
		return nil, fmt.Errorf("%w: attribute %q: %v", ErrInvalidSpec, n, err)
	}
	return &hcldec.AttrSpec{Name: n, Type: t, Required: a.GetRequired()}, nil
}

func convertLiteral(src string) (hcldec.Spec, error) {
	expr, diags := hclsyntax.ParseExpression([]byte(src), "literal", hcl.InitialPos)
	if diags.HasErrors() {
		return nil, fmt.Errorf("%w: literal %q: %s", ErrInvalidSpec, src, diags.Error())
	}
	v, diags := expr.Value(nil)
	if diags.HasErrors() {
		return nil, fmt.Errorf("%w: literal %q: %s", ErrInvalidSpec, src, diags.Error())
	}
	return &hcldec.LiteralSpec{Value: v}, nil
}

// parseType reads an HCL type expression ("string", "list(string)",
// "any"); empty means any.
func parseType(src string) (cty.Type, error) {
	if src == "" {
		return cty.DynamicPseudoType, nil
	}
	expr, diags := hclsyntax.ParseExpression([]byte(src), "type", hcl.InitialPos)
	if diags.HasErrors() {
		return cty.NilType, errors.New(diags.Error())
	}
	t, diags := typeexpr.TypeConstraint(expr)
	if diags.HasErrors() {
		return cty.NilType, errors.New(diags.Error())
	}
	return t, nil
}

func orName(own, implied string) string {
	if own != "" {
		return own
	}
	return implied
}

// Decode decodes a configuration as the Nomad API carries it (a task's
// `config`, a plugin's `config` block: JSON-shaped maps and lists) against
// spec, as Nomad's client does before it encodes the result for the
// plugin. Errors name the attribute.
func Decode(spec *Spec, config map[string]any) (cty.Value, error) {
	dec, err := Convert(spec)
	if err != nil {
		return cty.NilVal, err
	}
	buf, err := json.Marshal(config)
	if err != nil {
		return cty.NilVal, fmt.Errorf("encoding config as JSON: %w", err)
	}
	f, diags := hcljson.Parse(buf, "config")
	if diags.HasErrors() {
		return cty.NilVal, errors.New(diags.Error())
	}
	v, diags := hcldec.Decode(f.Body, dec, &hcl.EvalContext{})
	if diags.HasErrors() {
		return cty.NilVal, errors.New(diags.Error())
	}
	return v, nil
}

// Encode is Decode followed by the cty msgpack encoding Nomad sends a
// plugin (a task's msgpack_driver_config, a plugin's msgpack_config).
func Encode(spec *Spec, config map[string]any) ([]byte, error) {
	v, err := Decode(spec, config)
	if err != nil {
		return nil, err
	}
	return ctymsgpack.Marshal(v, v.Type())
}
