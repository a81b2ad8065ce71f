package provider

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/ext/typeexpr"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"
)

// jobFile is an embedded jobspec and the variables it declares.
type jobFile struct {
	Name string // file name, for messages
	Src  string
	// Vars maps each declared variable to its type constraint.
	Vars map[string]cty.Type
}

// attrVars are variables oasis_system_jobs sets from attributes of its
// own; the variable maps may not set them.
var attrVars = []string{"region", "datacenters"}

// parseJobFile reads the variable blocks of a jobspec.
func parseJobFile(name, src string) (*jobFile, error) {
	f, diags := hclsyntax.ParseConfig([]byte(src), name, hcl.InitialPos)
	if diags.HasErrors() {
		return nil, fmt.Errorf("parsing %s: %s", name, diags.Error())
	}
	jf := &jobFile{Name: name, Src: src, Vars: map[string]cty.Type{}}
	for _, b := range f.Body.(*hclsyntax.Body).Blocks {
		if b.Type != "variable" || len(b.Labels) != 1 {
			continue
		}
		ty := cty.DynamicPseudoType
		if a, ok := b.Body.Attributes["type"]; ok {
			t, diags := typeexpr.TypeConstraint(a.Expr)
			if diags.HasErrors() {
				return nil, fmt.Errorf("%s: type of variable %q: %s", name, b.Labels[0], diags.Error())
			}
			ty = t
		}
		jf.Vars[b.Labels[0]] = ty
	}
	return jf, nil
}

// varError is a problem with one variable of a map attribute.
type varError struct {
	Name string
	Msg  string
}

// assignments turns a map(string) of variables into the content of a
// variables file for the job: each value converted to the variable's type
// (numbers, bools; lists as an HCL or JSON list expression such as
// ["a","b"]). Every unknown name and bad value is reported.
func (jf *jobFile) assignments(vars map[string]string) (string, []varError) {
	var errs []varError
	var lines []string
	for _, name := range slices.Sorted(maps.Keys(vars)) {
		raw := vars[name]
		if slices.Contains(attrVars, name) {
			errs = append(errs, varError{name, fmt.Sprintf("%q is set by the resource's %s attribute; remove it from the variables", name, name)})
			continue
		}
		ty, ok := jf.Vars[name]
		if !ok {
			errs = append(errs, varError{name, fmt.Sprintf("%s declares no variable %q; it declares: %s",
				jf.Name, name, strings.Join(slices.Sorted(maps.Keys(jf.Vars)), ", "))})
			continue
		}
		v, err := convertVar(raw, ty)
		if err != nil {
			errs = append(errs, varError{name, fmt.Sprintf("variable %q of %s: %v", name, jf.Name, err)})
			continue
		}
		lines = append(lines, name+" = "+hclLiteral(v))
	}
	return strings.Join(lines, "\n"), errs
}

// convertVar converts a string value to a variable's type.
func convertVar(raw string, ty cty.Type) (cty.Value, error) {
	if ty.IsPrimitiveType() || ty == cty.DynamicPseudoType {
		want := ty
		if ty == cty.DynamicPseudoType {
			want = cty.String
		}
		v, err := convert.Convert(cty.StringVal(raw), want)
		if err != nil {
			return cty.NilVal, fmt.Errorf("%q is not a %s", raw, want.FriendlyName())
		}
		return v, nil
	}
	expr, diags := hclsyntax.ParseExpression([]byte(raw), "value", hcl.InitialPos)
	if diags.HasErrors() {
		return cty.NilVal, fmt.Errorf("%q is not an HCL expression of type %s (e.g. [\"a\", \"b\"])", raw, ty.FriendlyName())
	}
	v, diags := expr.Value(nil)
	if diags.HasErrors() {
		return cty.NilVal, fmt.Errorf("%q must be a literal of type %s: %s", raw, ty.FriendlyName(), diags.Error())
	}
	v, err := convert.Convert(v, ty)
	if err != nil {
		return cty.NilVal, fmt.Errorf("%q is not a %s: %v", raw, ty.FriendlyName(), err)
	}
	return v, nil
}

// hclLiteral writes a known value as HCL syntax.
func hclLiteral(v cty.Value) string {
	switch {
	case v.IsNull():
		return "null"
	case v.Type() == cty.String:
		s := strconv.Quote(v.AsString())
		s = strings.ReplaceAll(s, "${", "$${")
		return strings.ReplaceAll(s, "%{", "%%{")
	case v.Type() == cty.Number:
		return v.AsBigFloat().Text('f', -1)
	case v.Type() == cty.Bool:
		return strconv.FormatBool(v.True())
	case v.Type().IsListType() || v.Type().IsSetType() || v.Type().IsTupleType():
		var parts []string
		for it := v.ElementIterator(); it.Next(); {
			_, e := it.Element()
			parts = append(parts, hclLiteral(e))
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case v.Type().IsMapType() || v.Type().IsObjectType():
		var parts []string
		for it := v.ElementIterator(); it.Next(); {
			k, e := it.Element()
			parts = append(parts, strconv.Quote(k.AsString())+" = "+hclLiteral(e))
		}
		return "{" + strings.Join(parts, ", ") + "}"
	}
	return "null"
}

// jobVariables is the variables file for one job: region and datacenters
// from the attributes, then the map's assignments.
func (jf *jobFile) jobVariables(region string, dcs []string, vars map[string]string) (string, []varError) {
	body, errs := jf.assignments(vars)
	var b strings.Builder
	if region != "" {
		fmt.Fprintf(&b, "region = %s\n", hclLiteral(cty.StringVal(region)))
	}
	dv := make([]cty.Value, len(dcs))
	for i, d := range dcs {
		dv[i] = cty.StringVal(d)
	}
	if len(dv) > 0 {
		fmt.Fprintf(&b, "datacenters = %s\n", hclLiteral(cty.ListVal(dv)))
	}
	b.WriteString(body)
	return b.String(), errs
}

// submissionHash hashes a jobspec and its variables file: what the provider
// submits. The job carries it in its meta; Read compares.
func submissionHash(src, variables string) string {
	sum := sha256.Sum256([]byte(src + "\x00" + variables))
	return hex.EncodeToString(sum[:12])
}
