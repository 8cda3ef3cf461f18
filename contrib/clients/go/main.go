// Command enqueue_wait pushes one job onto an llmq queue and waits until a worker has finished
// it (go-redis v9).
//
//	go mod tidy          # fetches go-redis and writes go.sum (once)
//	go run . -prompt "Summarize: ..." -max-tokens 64
//	go run . -template summarize -var document=@report.txt -db /var/lib/llmq/llmq.db
//
// It prints one JSON line: {"id", "status", "finish_reason", "prompt_tokens",
// "completion_tokens", "error", "text"}. The text comes from the job hash's `result` field (the
// result line `llmq results` exports); a result over the worker's redis.result_max_bytes is in
// SQLite only (the field then holds {"truncated": true, ...}) and is read with -db through the
// sqlite3 shell (so the example needs no SQLite driver; a program of your own would use
// database/sql with one). Exit status 0 when the job completed, 1 when it failed or was
// cancelled, 2 on a timeout or a usage error.
//
// How it waits (docs/QUEUE.md): remember the newest entry of the events stream llmq:events, push
// the job, then XREAD from that entry on; an entry with the job's id and a final status ends the
// wait. The job hash is read after every empty XREAD too, so a trimmed stream cannot make it hang.
package main

import (
	"context"
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

	"github.com/redis/go-redis/v9"
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

func run() int {
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
	timeout := flag.Duration("timeout", 300*time.Second, "how long to wait")
	flag.Parse()
	if (*prompt == "") == (*template == "") || (*queue != "short" && *queue != "long") {
		fmt.Fprintln(os.Stderr, "enqueue_wait: give -prompt or -template; -queue is short or long")
		flag.Usage()
		return 2
	}
	if *id == "" {
		*id = newID()
	}
	job := map[string]any{"id": *id, "max_tokens": *maxTokens, "temperature": *temperature}
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

	opt, err := redis.ParseURL(*url)
	if err != nil {
		fmt.Fprintln(os.Stderr, "enqueue_wait:", err)
		return 2
	}
	ctx := context.Background()
	r := redis.NewClient(opt)
	defer r.Close()
	events, hkey := *prefix+":events", *prefix+":job:"+*id

	last := "0-0"
	newest, err := r.XRevRangeN(ctx, events, "+", "-", 1).Result()
	if err != nil {
		fmt.Fprintln(os.Stderr, "enqueue_wait:", err)
		return 2
	}
	if len(newest) > 0 {
		last = newest[0].ID
	}
	_, err = r.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, hkey, "status", "queued", "queue", *queue,
			"created_at", strconv.FormatFloat(float64(time.Now().UnixMilli())/1000, 'f', 3, 64), "attempts", 0)
		p.LPush(ctx, *prefix+":queue:"+*queue, string(body))
		return nil
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "enqueue_wait:", err)
		return 2
	}

	deadline := time.Now().Add(*timeout)
	status := ""
	for !final[status] {
		if time.Now().After(deadline) {
			fmt.Printf("{\"id\": %q, \"status\": \"timeout\"}\n", *id)
			return 2
		}
		streams, err := r.XRead(ctx, &redis.XReadArgs{Streams: []string{events, last}, Count: 1000, Block: time.Second}).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			fmt.Fprintln(os.Stderr, "enqueue_wait:", err)
			return 2
		}
		for _, s := range streams {
			for _, m := range s.Messages {
				last = m.ID
				if m.Values["id"] == *id && final[fmt.Sprint(m.Values["status"])] {
					status = fmt.Sprint(m.Values["status"])
				}
			}
		}
		if status == "" {
			if s, err := r.HGet(ctx, hkey, "status").Result(); err == nil && final[s] {
				status = s
			}
		}
	}
	h, err := r.HGetAll(ctx, hkey).Result()
	if err != nil {
		fmt.Fprintln(os.Stderr, "enqueue_wait:", err)
		return 2
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
			fmt.Fprintln(os.Stderr, "enqueue_wait:", err)
			return 2
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
