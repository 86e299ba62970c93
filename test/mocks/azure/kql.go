package armfake

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/caa-project/caa/test/mocks/cloud"
)

// The fake Resource Graph understands a small, exact subset of the Kusto
// Query Language, the one caa sends, and refuses everything else with a
// parse error, as Resource Graph refuses a query it cannot parse:
//
//	query  := table { '|' op }
//	table  := Resources | resources
//	op     := where cond { and cond }
//	        | extend name = value { , name = value }
//	        | project column { , column }
//	        | summarize agg { , agg } [ by column ]   (the last operator only)
//	cond   := field (== | =~ | != | !~) string
//	        | field (in | in~) ( string { , string } )
//	        | abs ( hash ( column ) % integer ) == integer
//	field  := type | resourceGroup | tags[string]
//	value  := tostring(path) | tostring(tags[string]) | pack_array(column { , column })
//	agg    := name = make_list(column) | name = count() | name = dcount(column)
//	path   := properties { .name | [integer] }
//	string := '...' or "..." with \\ \' \" \n \r \t escapes
//
// Keywords and column names are case-sensitive, as in KQL. hash() is not
// KQL's (xxhash64): it is FNV-1a's 64 bits read as a signed integer, so
// that about half its values are negative, as a signed 64-bit result may
// be; a query can rely only on it being a function of its argument. summarize answers as Resource Graph
// does (its "simplified first page only"): one page, never a $skipToken,
// resultTruncated when the groups did not fit.

// kqlQuery is a parsed query: its stages in order.
type kqlQuery struct {
	stages []kqlStage
}

type kqlStage struct {
	kind    string // where, extend, project, summarize
	conds   []kqlCond
	extends []kqlExtend
	columns []string
	aggs    []kqlAgg
	by      string // summarize's group column; "" for one group
}

type kqlCond struct {
	field  string // "type", "resourceGroup", "tags", or "hash" (abs(hash(column) % mod) == want)
	tag    string // for tags[...]; the column for hash
	op     string // ==, =~, !=, !~, in, in~
	values []string
	mod    int64 // for hash
	want   int64 // for hash
}

type kqlExtend struct {
	name string
	tag  string   // tostring(tags[tag]) when set
	pack []string // pack_array(columns...) when set
	path []any    // else tostring(properties...): string members and int indexes
}

// kqlAgg is one aggregate of summarize.
type kqlAgg struct {
	name, fn, column string // fn: make_list, count, dcount
}

// summarizes reports whether the query groups its rows (and so answers
// one page only).
func (q *kqlQuery) summarizes() bool {
	return len(q.stages) > 0 && q.stages[len(q.stages)-1].kind == "summarize"
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
			case strings.ContainsRune("|(),[].=%", r):
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
		if q.summarizes() {
			return nil, p.fail(op, "this fake serves summarize only as the last operator")
		}
		var st kqlStage
		switch {
		case op.kind == "ident" && op.text == "where":
			st, err = p.where()
		case op.kind == "ident" && op.text == "extend":
			st, err = p.extend()
		case op.kind == "ident" && op.text == "project":
			st, err = p.project()
		case op.kind == "ident" && op.text == "summarize":
			st, err = p.summarize()
		default:
			return nil, p.fail(op, "expected where, extend, project or summarize (the operators this fake serves)")
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
	case f.kind == "ident" && f.text == "abs":
		return p.hashCond()
	default:
		return c, p.fail(f, "expected type, resourceGroup, tags[...] or abs(hash(...) %% n) in a where clause")
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
		fn := p.next()
		if fn.kind == "ident" && fn.text == "pack_array" {
			cols, err := p.columnList()
			if err != nil {
				return st, err
			}
			st.extends = append(st.extends, kqlExtend{name: name.text, pack: cols})
		} else {
			if fn.kind != "ident" || fn.text != "tostring" {
				return st, p.fail(fn, "expected tostring or pack_array")
			}
			e, err := p.tostring(name.text)
			if err != nil {
				return st, err
			}
			st.extends = append(st.extends, e)
		}
		p.columns = append(p.columns, name.text)
		if t := p.peek(); t.kind != "punct" || t.text != "," {
			return st, nil
		}
		p.next()
	}
}

// tostring parses the rest of tostring(properties...) or tostring(tags[...]).
func (p *kqlParser) tostring(name string) (kqlExtend, *kqlError) {
	e := kqlExtend{name: name}
	if _, err := p.expect("punct", "("); err != nil {
		return e, err
	}
	src := p.next()
	if src.kind == "ident" && src.text == "tags" {
		if _, err := p.expect("punct", "["); err != nil {
			return e, err
		}
		k, err := p.expect("string", "")
		if err != nil {
			return e, err
		}
		if _, err := p.expect("punct", "]"); err != nil {
			return e, err
		}
		if _, err := p.expect("punct", ")"); err != nil {
			return e, err
		}
		e.tag = k.text
		return e, nil
	}
	if src.kind != "ident" || src.text != "properties" {
		return e, p.fail(src, "expected properties or tags")
	}
	for {
		t := p.next()
		if t.kind == "punct" && t.text == ")" {
			return e, nil
		}
		switch {
		case t.kind == "punct" && t.text == ".":
			m, err := p.expect("ident", "")
			if err != nil {
				return e, err
			}
			e.path = append(e.path, m.text)
		case t.kind == "punct" && t.text == "[":
			n, err := p.expect("int", "")
			if err != nil {
				return e, err
			}
			idx, _ := strconv.Atoi(n.text)
			e.path = append(e.path, idx)
			if _, err := p.expect("punct", "]"); err != nil {
				return e, err
			}
		default:
			return e, p.fail(t, "expected .member, [index] or )")
		}
	}
}

// column reads the name of a column defined so far.
func (p *kqlParser) column() (string, *kqlError) {
	c, err := p.expect("ident", "")
	if err != nil {
		return "", err
	}
	if !slices.Contains(p.columns, c.text) {
		return "", &kqlError{fmt.Sprintf("failed to resolve column or scalar expression named '%s'", c.text), c.line, c.col}
	}
	return c.text, nil
}

// columnList reads ( column { , column } ).
func (p *kqlParser) columnList() ([]string, *kqlError) {
	if _, err := p.expect("punct", "("); err != nil {
		return nil, err
	}
	var out []string
	for {
		c, err := p.column()
		if err != nil {
			return nil, err
		}
		out = append(out, c)
		sep := p.next()
		if sep.kind == "punct" && sep.text == ")" {
			return out, nil
		}
		if sep.kind != "punct" || sep.text != "," {
			return nil, p.fail(sep, "expected , or )")
		}
	}
}

// hashCond parses the rest of abs(hash(column) % mod) == want.
func (p *kqlParser) hashCond() (kqlCond, *kqlError) {
	c := kqlCond{field: "hash"}
	for _, want := range []string{"(", "hash", "("} {
		kind := "punct"
		if want == "hash" {
			kind = "ident"
		}
		if _, err := p.expect(kind, want); err != nil {
			return c, err
		}
	}
	col, err := p.column()
	if err != nil {
		return c, err
	}
	c.tag = col
	if _, err := p.expect("punct", ")"); err != nil {
		return c, err
	}
	if _, err := p.expect("punct", "%"); err != nil {
		return c, err
	}
	m, err := p.expect("int", "")
	if err != nil {
		return c, err
	}
	if _, err := p.expect("punct", ")"); err != nil {
		return c, err
	}
	if _, err := p.expect("punct", "=="); err != nil {
		return c, err
	}
	w, err := p.expect("int", "")
	if err != nil {
		return c, err
	}
	c.mod, _ = strconv.ParseInt(m.text, 10, 64)
	c.want, _ = strconv.ParseInt(w.text, 10, 64)
	if c.mod == 0 {
		// KQL's modulo by zero is an error at run time; Resource Graph
		// refuses the query.
		return c, &kqlError{"division by zero", m.line, m.col}
	}
	return c, nil
}

// summarize parses agg { , agg } [ by column ].
func (p *kqlParser) summarize() (kqlStage, *kqlError) {
	st := kqlStage{kind: "summarize"}
	var out []string
	for {
		name, err := p.expect("ident", "")
		if err != nil {
			return st, err
		}
		if slices.Contains(out, name.text) {
			return st, p.fail(name, "column %s is already defined", name.text)
		}
		if _, err := p.expect("punct", "="); err != nil {
			return st, err
		}
		fn := p.next()
		a := kqlAgg{name: name.text, fn: fn.text}
		switch {
		case fn.kind == "ident" && fn.text == "count":
			if _, err := p.expect("punct", "("); err != nil {
				return st, err
			}
			if _, err := p.expect("punct", ")"); err != nil {
				return st, err
			}
		case fn.kind == "ident" && (fn.text == "make_list" || fn.text == "dcount"):
			cols, err := p.columnList()
			if err != nil {
				return st, err
			}
			if len(cols) != 1 {
				return st, p.fail(fn, "%s takes one column here", fn.text)
			}
			a.column = cols[0]
		default:
			return st, p.fail(fn, "expected make_list, count or dcount (the aggregates this fake serves)")
		}
		st.aggs = append(st.aggs, a)
		out = append(out, a.name)
		t := p.peek()
		if t.kind == "punct" && t.text == "," {
			p.next()
			continue
		}
		if t.kind == "ident" && t.text == "by" {
			p.next()
			by, err := p.column()
			if err != nil {
				return st, err
			}
			if slices.Contains(out, by) {
				return st, p.fail(t, "column %s is already defined", by)
			}
			st.by = by
			out = append([]string{by}, out...)
		}
		p.columns = out
		return st, nil
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
// objects) and returns the rows it yields, in the documents' order (a
// summarize's groups in the order of their first row).
func (q *kqlQuery) run(docs []map[string]any) []map[string]any {
	rows := docs
	for _, st := range q.stages {
		var next []map[string]any
		switch st.kind {
		case "where":
			for _, row := range rows {
				if !slices.ContainsFunc(st.conds, func(c kqlCond) bool { return !c.match(row) }) {
					next = append(next, row)
				}
			}
		case "extend":
			for _, row := range rows {
				ext := make(map[string]any, len(row)+len(st.extends))
				for k, v := range row {
					ext[k] = v
				}
				for _, e := range st.extends {
					ext[e.name] = e.value(ext)
				}
				next = append(next, ext)
			}
		case "project":
			for _, row := range rows {
				proj := make(map[string]any, len(st.columns))
				for _, col := range st.columns {
					proj[col] = row[col]
				}
				next = append(next, proj)
			}
		case "summarize":
			next = st.group(rows)
		}
		rows = next
	}
	return rows
}

// tagFilter is the query's conditions on tags in its leading where stages,
// as a test of a resource's tags: a resource that fails it is in no answer
// of the query. nil when the query opens with no such condition.
func (q *kqlQuery) tagFilter() func(tags map[string]string) bool {
	var conds []kqlCond
	for _, st := range q.stages {
		if st.kind != "where" {
			break
		}
		for _, c := range st.conds {
			if c.field == "tags" {
				conds = append(conds, c)
			}
		}
	}
	if len(conds) == 0 {
		return nil
	}
	return func(tags map[string]string) bool {
		m := make(map[string]any, len(tags))
		for k, v := range tags {
			m[k] = v
		}
		row := map[string]any{"tags": m}
		for _, c := range conds {
			if !c.match(row) {
				return false
			}
		}
		return true
	}
}

// tagTerms are the conditions of tagFilter that a resource passes only by
// holding the tag with one of a few values (==, =~, in, in~): what the
// core's tag index can narrow a listing by. The index compares without
// case, tagFilter decides.
func (q *kqlQuery) tagTerms() []cloud.TagTerm {
	var out []cloud.TagTerm
	for _, st := range q.stages {
		if st.kind != "where" {
			break
		}
		for _, c := range st.conds {
			if c.field == "tags" && (c.op == "==" || c.op == "=~" || c.op == "in" || c.op == "in~") {
				out = append(out, cloud.TagTerm{Key: c.tag, Values: c.values})
			}
		}
	}
	return out
}

// value is an extended column's value in row.
func (e kqlExtend) value(row map[string]any) any {
	switch {
	case e.tag != "":
		var v any
		if tags, ok := row["tags"].(map[string]any); ok {
			v = tags[e.tag]
		}
		return toKQLString(v)
	case e.pack != nil:
		out := make([]any, len(e.pack))
		for i, c := range e.pack {
			out[i] = row[c]
		}
		return out
	}
	return toKQLString(walk(row["properties"], e.path))
}

// group is summarize over rows. Without by, an empty input still gives
// one row (count() 0), as in KQL.
func (st kqlStage) group(rows []map[string]any) []map[string]any {
	type acc struct {
		key  any
		rows []map[string]any
	}
	var order []string
	groups := map[string]*acc{}
	if st.by == "" {
		order, groups[""] = []string{""}, &acc{}
	}
	for _, row := range rows {
		k := ""
		if st.by != "" {
			raw, _ := json.Marshal(row[st.by])
			k = string(raw)
		}
		g, ok := groups[k]
		if !ok {
			g = &acc{key: row[st.by]}
			groups[k] = g
			order = append(order, k)
		}
		g.rows = append(g.rows, row)
	}
	out := make([]map[string]any, 0, len(order))
	for _, k := range order {
		g := groups[k]
		row := map[string]any{}
		if st.by != "" {
			row[st.by] = g.key
		}
		for _, a := range st.aggs {
			switch a.fn {
			case "count":
				row[a.name] = int64(len(g.rows))
			case "make_list":
				list := make([]any, 0, len(g.rows))
				for _, r := range g.rows {
					if v := r[a.column]; v != nil {
						list = append(list, v)
					}
				}
				row[a.name] = list
			case "dcount":
				seen := map[string]bool{}
				for _, r := range g.rows {
					if v := r[a.column]; v != nil {
						raw, _ := json.Marshal(v)
						seen[string(raw)] = true
					}
				}
				row[a.name] = int64(len(seen))
			}
		}
		out = append(out, row)
	}
	return out
}

func (c kqlCond) match(row map[string]any) bool {
	var v any
	switch c.field {
	case "hash":
		h := kqlHash(row[c.tag]) % c.mod
		if h < 0 {
			h = -h
		}
		return h == c.want
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

// kqlHash is the fake's hash(): FNV-1a over the value's text (a string as
// it is, anything else as JSON), its 64 bits read as a signed integer.
func kqlHash(v any) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(toKQLString(v)))
	return int64(h.Sum64())
}
