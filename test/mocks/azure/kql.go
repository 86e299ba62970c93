package armfake

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The fake Resource Graph understands a small, exact subset of the Kusto
// Query Language, the one caa sends, and refuses everything else with a
// parse error, as Resource Graph refuses a query it cannot parse:
//
//	query  := table { '|' op }
//	table  := Resources | resources
//	op     := where cond { and cond }
//	        | extend name = tostring(path) { , name = tostring(path) }
//	        | project column { , column }
//	cond   := field (== | =~ | != | !~) string
//	        | field (in | in~) ( string { , string } )
//	field  := type | resourceGroup | tags[string]
//	path   := properties { .name | [integer] }
//	string := '...' or "..." with \\ \' \" \n \r \t escapes
//
// Keywords and column names are case-sensitive, as in KQL.

// kqlQuery is a parsed query: its stages in order.
type kqlQuery struct {
	stages []kqlStage
}

type kqlStage struct {
	kind    string // where, extend, project
	conds   []kqlCond
	extends []kqlExtend
	columns []string
}

type kqlCond struct {
	field  string // "type", "resourceGroup", or "tags"
	tag    string // for tags[...]
	op     string // ==, =~, !=, !~, in, in~
	values []string
}

type kqlExtend struct {
	name string
	path []any // string members and int indexes, after "properties"
}

// kqlError is a query Resource Graph would refuse: what is wrong and where.
type kqlError struct {
	msg  string
	line int
	col  int
}

func (e *kqlError) Error() string {
	return fmt.Sprintf("%s (line %d, position %d)", e.msg, e.line, e.col)
}

// baseColumns are the columns of the Resources table the fake serves.
var baseColumns = []string{"id", "name", "type", "location", "resourceGroup", "subscriptionId", "tags", "zones", "properties"}

type kqlToken struct {
	kind      string // ident, string, int, punct, eof
	text      string
	line, col int
}

func lexKQL(src string) ([]kqlToken, *kqlError) {
	var out []kqlToken
	line, col := 1, 0
	i := 0
	for i < len(src) {
		r, size := utf8.DecodeRuneInString(src[i:])
		startLine, startCol := line, col
		switch {
		case r == '\n':
			line, col = line+1, 0
			i += size
			continue
		case unicode.IsSpace(r):
			i += size
			col++
			continue
		case r == '_' || r < utf8.RuneSelf && unicode.IsLetter(r):
			j := i
			for j < len(src) && (src[j] == '_' || src[j] < utf8.RuneSelf && (unicode.IsLetter(rune(src[j])) || unicode.IsDigit(rune(src[j])))) {
				j++
			}
			text := src[i:j]
			if text == "in" && j < len(src) && src[j] == '~' {
				j++
				text = "in~"
			}
			out = append(out, kqlToken{"ident", text, startLine, startCol})
			col += j - i
			i = j
		case r >= '0' && r <= '9':
			j := i
			for j < len(src) && src[j] >= '0' && src[j] <= '9' {
				j++
			}
			out = append(out, kqlToken{"int", src[i:j], startLine, startCol})
			col += j - i
			i = j
		case r == '\'' || r == '"':
			var b strings.Builder
			j := i + 1
			closed := false
			for j < len(src) {
				c := src[j]
				if c == byte(r) {
					closed = true
					j++
					break
				}
				if c == '\n' {
					break
				}
				if c == '\\' {
					if j+1 >= len(src) {
						break
					}
					esc := map[byte]byte{'\\': '\\', '\'': '\'', '"': '"', 'n': '\n', 'r': '\r', 't': '\t'}[src[j+1]]
					if esc == 0 {
						return nil, &kqlError{fmt.Sprintf("unknown escape sequence \\%c in a string literal", src[j+1]), line, col + (j - i)}
					}
					b.WriteByte(esc)
					j += 2
					continue
				}
				b.WriteByte(c)
				j++
			}
			if !closed {
				return nil, &kqlError{"unterminated string literal", startLine, startCol}
			}
			out = append(out, kqlToken{"string", b.String(), startLine, startCol})
			col += utf8.RuneCountInString(src[i:j])
			i = j
		default:
			two := ""
			if i+1 < len(src) {
				two = src[i : i+2]
			}
			switch {
			case two == "==" || two == "=~" || two == "!=" || two == "!~":
				out = append(out, kqlToken{"punct", two, startLine, startCol})
				i += 2
				col += 2
			case strings.ContainsRune("|(),[].=", r):
				out = append(out, kqlToken{"punct", string(r), startLine, startCol})
				i += size
				col++
			default:
				return nil, &kqlError{fmt.Sprintf("unexpected character %q", r), startLine, startCol}
			}
		}
	}
	out = append(out, kqlToken{"eof", "", line, col})
	return out, nil
}

type kqlParser struct {
	toks []kqlToken
	pos  int
	// columns are the columns defined so far, for extend and project.
	columns []string
}

func (p *kqlParser) peek() kqlToken { return p.toks[p.pos] }

func (p *kqlParser) next() kqlToken {
	t := p.toks[p.pos]
	if t.kind != "eof" {
		p.pos++
	}
	return t
}

func (p *kqlParser) fail(t kqlToken, format string, args ...any) *kqlError {
	found := t.text
	if t.kind == "eof" {
		found = "end of query"
	}
	return &kqlError{fmt.Sprintf(format, args...) + fmt.Sprintf(", found %q", found), t.line, t.col}
}

func (p *kqlParser) expect(kind, text string) (kqlToken, *kqlError) {
	t := p.next()
	if t.kind != kind || (text != "" && t.text != text) {
		want := text
		if want == "" {
			want = kind
		}
		return t, p.fail(t, "expected %s", want)
	}
	return t, nil
}

// parseKQL parses a query of the subset, or says why it is not one.
func parseKQL(src string) (*kqlQuery, *kqlError) {
	toks, err := lexKQL(src)
	if err != nil {
		return nil, err
	}
	p := &kqlParser{toks: toks, columns: slices.Clone(baseColumns)}
	t := p.next()
	if t.kind != "ident" || (t.text != "Resources" && t.text != "resources") {
		return nil, p.fail(t, "expected the table Resources")
	}
	q := &kqlQuery{}
	for p.peek().kind != "eof" {
		if _, err := p.expect("punct", "|"); err != nil {
			return nil, err
		}
		op := p.next()
		var st kqlStage
		switch {
		case op.kind == "ident" && op.text == "where":
			st, err = p.where()
		case op.kind == "ident" && op.text == "extend":
			st, err = p.extend()
		case op.kind == "ident" && op.text == "project":
			st, err = p.project()
		default:
			return nil, p.fail(op, "expected where, extend or project (the operators this fake serves)")
		}
		if err != nil {
			return nil, err
		}
		q.stages = append(q.stages, st)
	}
	return q, nil
}

func (p *kqlParser) where() (kqlStage, *kqlError) {
	st := kqlStage{kind: "where"}
	for {
		c, err := p.cond()
		if err != nil {
			return st, err
		}
		st.conds = append(st.conds, c)
		if t := p.peek(); t.kind != "ident" || t.text != "and" {
			return st, nil
		}
		p.next()
	}
}

func (p *kqlParser) cond() (kqlCond, *kqlError) {
	var c kqlCond
	f := p.next()
	switch {
	case f.kind == "ident" && (f.text == "type" || f.text == "resourceGroup"):
		c.field = f.text
	case f.kind == "ident" && f.text == "tags":
		c.field = "tags"
		if _, err := p.expect("punct", "["); err != nil {
			return c, err
		}
		k, err := p.expect("string", "")
		if err != nil {
			return c, err
		}
		if _, err := p.expect("punct", "]"); err != nil {
			return c, err
		}
		c.tag = k.text
	default:
		return c, p.fail(f, "expected type, resourceGroup or tags[...] in a where clause")
	}
	op := p.next()
	switch {
	case op.kind == "punct" && (op.text == "==" || op.text == "=~" || op.text == "!=" || op.text == "!~"):
		c.op = op.text
		v, err := p.expect("string", "")
		if err != nil {
			return c, err
		}
		c.values = []string{v.text}
	case op.kind == "ident" && (op.text == "in" || op.text == "in~"):
		c.op = op.text
		if _, err := p.expect("punct", "("); err != nil {
			return c, err
		}
		for {
			v, err := p.expect("string", "")
			if err != nil {
				return c, err
			}
			c.values = append(c.values, v.text)
			sep := p.next()
			if sep.kind == "punct" && sep.text == ")" {
				break
			}
			if sep.kind != "punct" || sep.text != "," {
				return c, p.fail(sep, "expected , or )")
			}
		}
	default:
		return c, p.fail(op, "expected ==, =~, !=, !~, in or in~")
	}
	return c, nil
}

func (p *kqlParser) extend() (kqlStage, *kqlError) {
	st := kqlStage{kind: "extend"}
	for {
		name, err := p.expect("ident", "")
		if err != nil {
			return st, err
		}
		if slices.Contains(p.columns, name.text) {
			return st, p.fail(name, "column %s is already defined", name.text)
		}
		if _, err := p.expect("punct", "="); err != nil {
			return st, err
		}
		if _, err := p.expect("ident", "tostring"); err != nil {
			return st, err
		}
		if _, err := p.expect("punct", "("); err != nil {
			return st, err
		}
		if _, err := p.expect("ident", "properties"); err != nil {
			return st, err
		}
		var path []any
		for {
			t := p.next()
			if t.kind == "punct" && t.text == ")" {
				break
			}
			switch {
			case t.kind == "punct" && t.text == ".":
				m, err := p.expect("ident", "")
				if err != nil {
					return st, err
				}
				path = append(path, m.text)
			case t.kind == "punct" && t.text == "[":
				n, err := p.expect("int", "")
				if err != nil {
					return st, err
				}
				idx, _ := strconv.Atoi(n.text)
				path = append(path, idx)
				if _, err := p.expect("punct", "]"); err != nil {
					return st, err
				}
			default:
				return st, p.fail(t, "expected .member, [index] or )")
			}
		}
		st.extends = append(st.extends, kqlExtend{name: name.text, path: path})
		p.columns = append(p.columns, name.text)
		if t := p.peek(); t.kind != "punct" || t.text != "," {
			return st, nil
		}
		p.next()
	}
}

func (p *kqlParser) project() (kqlStage, *kqlError) {
	st := kqlStage{kind: "project"}
	for {
		c, err := p.expect("ident", "")
		if err != nil {
			return st, err
		}
		if !slices.Contains(p.columns, c.text) {
			return st, &kqlError{fmt.Sprintf("failed to resolve column or scalar expression named '%s'", c.text), c.line, c.col}
		}
		st.columns = append(st.columns, c.text)
		if t := p.peek(); t.kind != "punct" || t.text != "," {
			p.columns = st.columns
			return st, nil
		}
		p.next()
	}
}

// run evaluates the query over documents (Resource Graph's rows, as JSON
// objects) and returns the rows it yields, in the documents' order.
func (q *kqlQuery) run(docs []map[string]any) []map[string]any {
	var out []map[string]any
	for _, d := range docs {
		row := d
		keep := true
		for _, st := range q.stages {
			switch st.kind {
			case "where":
				for _, c := range st.conds {
					if !c.match(row) {
						keep = false
						break
					}
				}
			case "extend":
				ext := make(map[string]any, len(row)+len(st.extends))
				for k, v := range row {
					ext[k] = v
				}
				for _, e := range st.extends {
					ext[e.name] = toKQLString(walk(row["properties"], e.path))
				}
				row = ext
			case "project":
				proj := make(map[string]any, len(st.columns))
				for _, col := range st.columns {
					proj[col] = row[col]
				}
				row = proj
			}
			if !keep {
				break
			}
		}
		if keep {
			out = append(out, row)
		}
	}
	return out
}

func (c kqlCond) match(row map[string]any) bool {
	var v any
	switch c.field {
	case "tags":
		if tags, ok := row["tags"].(map[string]any); ok {
			v = tags[c.tag]
		}
	default:
		v = row[c.field]
	}
	s, isString := v.(string)
	eq := func(want string, fold bool) bool {
		if !isString {
			return false
		}
		if fold {
			return strings.EqualFold(s, want)
		}
		return s == want
	}
	switch c.op {
	case "==":
		return eq(c.values[0], false)
	case "=~":
		return eq(c.values[0], true)
	case "!=":
		return !eq(c.values[0], false)
	case "!~":
		return !eq(c.values[0], true)
	case "in", "in~":
		for _, want := range c.values {
			if eq(want, c.op == "in~") {
				return true
			}
		}
	}
	return false
}

// walk follows a path of members and indexes into a JSON value; nil when
// any step is missing.
func walk(v any, path []any) any {
	for _, step := range path {
		switch s := step.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[s]
		case int:
			a, ok := v.([]any)
			if !ok || s >= len(a) {
				return nil
			}
			v = a[s]
		}
	}
	return v
}

// toKQLString is tostring(): a string as it is, null as "", anything
// else (a number, a bag, an array) in its JSON form.
func toKQLString(v any) string {
	switch x := v.(type) {
	case nil:
		return ""
	case string:
		return x
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	return string(raw)
}
