// Command enqueue_wait pushes one job onto an llmq queue and waits until a worker has finished
// it (redigo, the Redis client Debian packages; Go 1.19, Debian 12's, or newer).
//
//	go mod tidy && go build              # fetches redigo and writes go.sum
//	# or, offline on Debian 12: apt install golang-go golang-github-gomodule-redigo-dev, then
//	go mod edit -replace github.com/gomodule/redigo=/usr/share/gocode/src/github.com/gomodule/redigo
//	GOFLAGS=-mod=mod go build
//	./llmq-client-example --prompt "Summarize: ..." --max-tokens 64
//	./llmq-client-example --template summarize --var document=@report.txt --db /var/lib/llmq/llmq.db
//
// It prints one JSON line: {"id", "status", "finish_reason", "prompt_tokens",
// "completion_tokens", "error", "text"}. The text comes from the job hash's `result` field (the
// result line `llmq results` exports); a result over the worker's redis.result_max_bytes is in
// SQLite only (the field then holds {"truncated": true, ...}) and is read with --db through the
// sqlite3 shell (so the example needs no SQLite driver; a program of your own would use
// database/sql with one). --timeout is in seconds, as in the other examples and `llmq wait`.
// Exit status 0 when the job completed, 1 when it failed or was cancelled, 2 on a timeout or a
// usage error; --help prints the options.
//
// How it waits (docs/QUEUE.md): remember the newest entry of the events stream llmq:events, push
// the job, then XREAD from that entry on; an entry with the job's id and a final status ends the
// wait. The job hash is read after every empty XREAD too, so a trimmed stream cannot make it hang.
package main

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/gomodule/redigo/redis"
)

var final = map[string]bool{"completed": true, "failed": true, "cancelled": true}

type varList map[string]string

func (v varList) String() string { return fmt.Sprint(map[string]string(v)) }
func (v varList) Set(s string) error {
	name, val, ok := strings.Cut(s, "=")
	if !ok || name == "" {
		return errors.New("expected NAME=TEXT or NAME=@FILE")
	}
	if strings.HasPrefix(val, "@") {
		b, err := os.ReadFile(val[1:])
		if err != nil {
			return err
		}
		val = string(b)
	}
	v[name] = val
	return nil
}

// newID returns a random UUID (version 4) in its text form.
func newID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

type result struct {
	ID               string  `json:"id"`
	Status           string  `json:"status"`
	FinishReason     *string `json:"finish_reason"`
	PromptTokens     int     `json:"prompt_tokens"`
	CompletionTokens int     `json:"completion_tokens"`
	Error            *string `json:"error"`
	Text             *string `json:"text"`
}

// readRow returns the job's output and error from the SQLite database through the sqlite3 shell.
func readRow(db, id string) (output, errText *string, err error) {
	q := "SELECT output, error FROM jobs WHERE id = '" + strings.ReplaceAll(id, "'", "''") + "'"
	out, err := exec.Command("sqlite3", "-readonly", "-json", db, q).Output()
	if err != nil {
		return nil, nil, fmt.Errorf("sqlite3 %s: %w", db, err)
	}
	var rows []struct {
		Output *string `json:"output"`
		Error  *string `json:"error"`
	}
	if len(strings.TrimSpace(string(out))) > 0 {
		if err := json.Unmarshal(out, &rows); err != nil {
			return nil, nil, err
		}
	}
	if len(rows) == 0 {
		return nil, nil, nil
	}
	return rows[0].Output, rows[0].Error, nil
}

func optional(m map[string]string, k string) *string {
	if v, ok := m[k]; ok {
		return &v
	}
	return nil
}

// streamEntry is one entry of an XREAD reply: its id and fields.
type streamEntry struct {
	id     string
	fields map[string]string
}

// readEntries flattens an XREAD reply ([[stream, [[id, [field, value, ...]], ...]], ...]; nil
// when the block timed out) into its entries.
func readEntries(reply interface{}) ([]streamEntry, error) {
	streams, err := redis.Values(reply, nil)
	if errors.Is(err, redis.ErrNil) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	var out []streamEntry
	for _, s := range streams {
		sv, err := redis.Values(s, nil)
		if err != nil || len(sv) != 2 {
			return nil, fmt.Errorf("XREAD: unexpected reply %v", s)
		}
		entries, err := redis.Values(sv[1], nil)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			ev, err := redis.Values(e, nil)
			if err != nil || len(ev) != 2 {
				return nil, fmt.Errorf("XREAD: unexpected entry %v", e)
			}
			id, err := redis.String(ev[0], nil)
			if err != nil {
				return nil, err
			}
			fields, err := redis.StringMap(ev[1], nil)
			if err != nil {
				return nil, err
			}
			out = append(out, streamEntry{id, fields})
		}
	}
	return out, nil
}

func run() int {
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: enqueue_wait [--redis URL] [--prefix P] [--queue short|long] "+
			"(--prompt TEXT | --template NAME [--var NAME=TEXT|NAME=@FILE]...) [--max-tokens N] "+
			"[--temperature T] [--id ID] [--db PATH] [--timeout S]")
		flag.PrintDefaults()
	}
	url := flag.String("redis", "redis://127.0.0.1:6379/0", "Redis URL (redis.url)")
	prefix := flag.String("prefix", "llmq", "key prefix (redis.prefix)")
	queue := flag.String("queue", "short", "short or long")
	prompt := flag.String("prompt", "", "the prompt, sent without a chat template")
	template := flag.String("template", "", "a template of the worker's config")
	vars := varList{}
	flag.Var(vars, "var", "template variable NAME=TEXT or NAME=@FILE (repeatable)")
	maxTokens := flag.Int("max-tokens", 64, "max_tokens")
	temperature := flag.Float64("temperature", 0, "temperature")
	id := flag.String("id", "", "job id (default: a new UUID)")
	db := flag.String("db", "", "the worker's SQLite database, to print the generated text")
	timeout := flag.Float64("timeout", 300, "seconds to wait")
	flag.CommandLine.SetOutput(os.Stdout) // --help goes to stdout (exit 0); usage errors below to stderr
	flag.CommandLine.Init(os.Args[0], flag.ContinueOnError)
	if err := flag.CommandLine.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	flag.CommandLine.SetOutput(os.Stderr)
	if (*prompt == "") == (*template == "") || (*queue != "short" && *queue != "long") || *timeout <= 0 {
		fmt.Fprintln(os.Stderr, "enqueue_wait: give --prompt or --template; --queue is short or long; --timeout S > 0")
		flag.Usage()
		return 2
	}
	if *id == "" {
		*id = newID()
	}
	job := map[string]interface{}{"id": *id, "max_tokens": *maxTokens, "temperature": *temperature}
	if *prompt != "" {
		job["prompt"] = *prompt
	} else {
		job["template"], job["vars"] = *template, map[string]string(vars)
	}
	body, err := json.Marshal(job)
	if err != nil {
		fmt.Fprintln(os.Stderr, "enqueue_wait:", err)
		return 2
	}
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "enqueue_wait:", err)
		return 2
	}

	r, err := redis.DialURL(*url, redis.DialConnectTimeout(10*time.Second))
	if err != nil {
		return fail(err)
	}
	defer r.Close()
	events, hkey := *prefix+":events", *prefix+":job:"+*id

	last := "0-0"
	reply, err := r.Do("XREVRANGE", events, "+", "-", "COUNT", 1)
	if err != nil {
		return fail(err)
	}
	newest, err := readEntries([]interface{}{[]interface{}{events, reply}}) // shaped as XREAD's reply
	if err != nil {
		return fail(err)
	}
	if len(newest) > 0 {
		last = newest[0].id
	}
	r.Send("MULTI")
	r.Send("HSET", hkey, "status", "queued", "queue", *queue,
		"created_at", strconv.FormatFloat(float64(time.Now().UnixMilli())/1000, 'f', 3, 64), "attempts", 0)
	r.Send("LPUSH", *prefix+":queue:"+*queue, string(body))
	if _, err := r.Do("EXEC"); err != nil {
		return fail(err)
	}

	deadline := time.Now().Add(time.Duration(*timeout * float64(time.Second)))
	status := ""
	for !final[status] {
		if time.Now().After(deadline) {
			fmt.Printf("{\"id\": %q, \"status\": \"timeout\"}\n", *id)
			return 2
		}
		reply, err := r.Do("XREAD", "COUNT", 1000, "BLOCK", 1000, "STREAMS", events, last)
		if err != nil {
			return fail(err)
		}
		entries, err := readEntries(reply)
		if err != nil {
			return fail(err)
		}
		for _, e := range entries {
			last = e.id
			if e.fields["id"] == *id && final[e.fields["status"]] {
				status = e.fields["status"]
			}
		}
		if status == "" {
			if s, err := redis.String(r.Do("HGET", hkey, "status")); err == nil && final[s] {
				status = s
			}
		}
	}
	h, err := redis.StringMap(r.Do("HGETALL", hkey))
	if err != nil {
		return fail(err)
	}
	res := result{ID: *id, Status: status, FinishReason: optional(h, "finish_reason"), Error: optional(h, "error")}
	if h["status"] != "" {
		res.Status = h["status"]
	}
	res.PromptTokens, _ = strconv.Atoi(h["prompt_tokens"])
	res.CompletionTokens, _ = strconv.Atoi(h["completion_tokens"])
	var line struct { // the result line: llmq's result object
		Text      *string `json:"text"`
		Truncated bool    `json:"truncated"`
	}
	if json.Unmarshal([]byte(h["result"]), &line) == nil && !line.Truncated {
		res.Text = line.Text
	} else if *db != "" {
		out, e, err := readRow(*db, *id)
		if err != nil {
			return fail(err)
		}
		res.Text = out
		if e != nil {
			res.Error = e
		}
	}
	printed, _ := json.Marshal(res)
	fmt.Println(string(printed))
	if res.Status == "completed" {
		return 0
	}
	return 1
}

func main() { os.Exit(run()) }
