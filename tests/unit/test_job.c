/* The job parser: every field of both forms, every error, defaults and their precedence.
 *
 * Errors are checked by kind (enum job_error) and by a piece of the message that a user reads,
 * so a message that stops naming the field or the value fails the test. */
#include <jansson.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine/chat_template.h"
#include "engine/json_schema.h"
#include "engine/model.h"
#include "engine/tokenizer.h"
#include "engine/util/scratch_dir.h"
#include "queue/scripts.h"
#include "testutil.h"
#include "worker/config/config.h"
#include "worker/jobs/job.h"

static int parse(const char *line, struct job *j, char *err, size_t errlen)
{
    struct job_opts o = job_opts_default();
    return job_parse(line, strlen(line), &o, j, err, errlen);
}

/* ---- errors, table-driven: each line fails with this kind and this text in the message */

struct bad_case {
    const char *line;
    int rc;
    const char *msg;
};

static const struct bad_case bad_cases[] = {
    /* not JSON, or not a job object */
    {"", JOB_ERR_JSON, "invalid JSON"},
    {"not json", JOB_ERR_JSON, "invalid JSON (line 1, column 3): invalid token near 'not'"},
    {"{\"prompt\": \"a\"", JOB_ERR_JSON, "invalid JSON"},
    {"{\"prompt\": \"a\"} trailing", JOB_ERR_JSON, "invalid JSON"},
    {"[1, 2]", JOB_ERR_JSON, "a job is an object, got an array"},
    {"\"hello\"", JOB_ERR_JSON, "got a string"},
    {"{\"prompt\": \"bad \\x escape\"}", JOB_ERR_JSON, "invalid JSON"},
    {"{\"prompt\": \"\\ud800\"}", JOB_ERR_JSON, "invalid JSON"},
    {"{\"prompt\": \"nul \\u0000\"}", JOB_ERR_JSON, "invalid JSON"},
    {"{\"prompt\": \"a\", \"prompt\": \"b\"}", JOB_ERR_JSON, "duplicate"},
    {"{\"prompt\": \"\xff\xfe\"}", JOB_ERR_JSON, "invalid JSON"},
    /* missing, unknown and conflicting fields */
    {"{}", JOB_ERR_INVALID, "one of 'prompt', 'messages', 'template' or 'document' is required"},
    {"{\"id\": \"x\"}", JOB_ERR_INVALID, "is required"},
    {"{\"prompt\": \"a\", \"max_token\": 5}", JOB_ERR_INVALID,
     "unknown field 'max_token' (did you mean 'max_tokens'?)"},
    {"{\"prompt\": \"a\", \"zzzzzzzz\": 5}", JOB_ERR_INVALID, "unknown field 'zzzzzzzz'"},
    {"{\"prompt\": \"a\", \"messages\": [{\"role\": \"user\", \"content\": \"b\"}]}", JOB_ERR_INVALID,
     "exclude each other"},
    {"{\"prompt\": \"a\", \"vars\": {\"x\": \"y\"}}", JOB_ERR_INVALID,
     "field 'vars': only used with 'template' or 'document'"},
    {"{\"template\": \"summarize\", \"vars\": {}}", JOB_ERR_INVALID, "templates are not configured"},
    /* id */
    {"{\"id\": 5, \"prompt\": \"a\"}", JOB_ERR_INVALID, "field 'id': expected a string, got 5"},
    {"{\"id\": \"\", \"prompt\": \"a\"}", JOB_ERR_INVALID, "field 'id': expected 1 to 256 bytes"},
    {"{\"id\": \"a\\nb\", \"prompt\": \"a\"}", JOB_ERR_INVALID,
     "field 'id': must not contain control characters"},
    /* prompt and messages */
    {"{\"prompt\": \"\"}", JOB_ERR_INVALID, "field 'prompt': must not be empty"},
    {"{\"prompt\": 7}", JOB_ERR_INVALID,
     "field 'prompt': expected a non-empty string, or a list of token ids, got 7"},
    {"{\"prompt\": [\"a\", \"b\"]}", JOB_ERR_INVALID,
     "field 'prompt': only one prompt per request (2 given)"},
    {"{\"prompt\": [1, -2]}", JOB_ERR_INVALID, "field 'prompt[1]': expected a token id (an integer >= 0)"},
    {"{\"prompt\": []}", JOB_ERR_INVALID,
     "field 'prompt': expected a non-empty string, or a list of token ids"},
    {"{\"prompt\": \"a\", \"top_p\": 1e-50}", JOB_ERR_INVALID, "field 'top_p': 1e-50 is not representable"},
    {"{\"prompt\": \"a\", \"repetition_penalty\": 1e300}", JOB_ERR_INVALID,
     "field 'repetition_penalty': 1e+300 is not representable"},
    {"{\"prompt\": \"a\", \"repetition_penalty\": 1e-50}", JOB_ERR_INVALID,
     "field 'repetition_penalty': 1e-50 is not representable"},
    {"{\"messages\": []}", JOB_ERR_INVALID,
     "field 'messages': expected a non-empty list of messages, got []"},
    {"{\"messages\": \"hi\"}", JOB_ERR_INVALID, "field 'messages': expected a non-empty list"},
    {"{\"messages\": [{\"role\": \"user\"}]}", JOB_ERR_INVALID, "field 'messages[0].content'"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", JOB_ERR_INVALID,
     "field 'messages[0].content'"},
    {"{\"messages\": [{\"role\": 3, \"content\": \"x\"}]}", JOB_ERR_INVALID,
     "field 'messages[0].role': expected a role such as \"user\", got 3"},
    {"{\"messages\": [{\"content\": \"x\"}]}", JOB_ERR_INVALID, "field 'messages[0].role': missing"},
    {"{\"messages\": [\"hi\"]}", JOB_ERR_INVALID, "field 'messages[0]': expected an object"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\", \"colour\": 1}]}", JOB_ERR_INVALID,
     "field 'messages[0].colour': unknown key"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": null}]}", JOB_ERR_INVALID,
     "field 'messages[0].content': null is only allowed in an assistant message with tool_calls"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\", \"name\": 1}]}", JOB_ERR_INVALID,
     "field 'messages[0].name': expected a string, got 1"},
    {"{\"messages\": [{\"role\": \"tool\", \"content\": \"x\", \"tool_call_id\": [1]}]}", JOB_ERR_INVALID,
     "field 'messages[0].tool_call_id': expected a string"},
    {"{\"messages\": [{\"role\": \"assistant\", \"content\": \"x\", \"reasoning_content\": 2}]}",
     JOB_ERR_INVALID, "field 'messages[0].reasoning_content': expected a string or null, got 2"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\", \"tool_calls\": []}]}", JOB_ERR_INVALID,
     "field 'messages[0].tool_calls': only assistant messages have tool calls"},
    {"{\"messages\": [{\"role\": \"assistant\", \"tool_calls\": {}}]}", JOB_ERR_INVALID,
     "field 'messages[0].tool_calls': expected a list of tool calls"},
    {"{\"messages\": [{\"role\": \"assistant\", \"tool_calls\": [{\"type\": \"function\"}]}]}",
     JOB_ERR_INVALID, "field 'messages[0].tool_calls[0].function': expected an object"},
    {"{\"messages\": [{\"role\": \"assistant\", \"tool_calls\": [{\"type\": \"code\", \"function\": {}}]}]}",
     JOB_ERR_INVALID, "field 'messages[0].tool_calls[0].type': expected \"function\", got \"code\""},
    {"{\"messages\": [{\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"arguments\": \"{}\"}}]}]}",
     JOB_ERR_INVALID, "field 'messages[0].tool_calls[0].function.name': expected a string"},
    {"{\"messages\": [{\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"name\": \"f\", "
     "\"arguments\": 5}}]}]}",
     JOB_ERR_INVALID,
     "field 'messages[0].tool_calls[0].function.arguments': expected a JSON string or an object, got 5"},
    {"{\"messages\": [{\"role\": \"assistant\", \"tool_calls\": []}]}", JOB_ERR_INVALID,
     "field 'messages[0].content': missing"},
    /* tools, documents, chat_template_kwargs */
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"tools\": {}}", JOB_ERR_INVALID,
     "field 'tools': expected a list of tools"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"tools\": [{\"type\": \"function\"}]}",
     JOB_ERR_INVALID, "field 'tools[0].function': expected an object"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"tools\": [{\"function\": {}}]}",
     JOB_ERR_INVALID, "field 'tools[0].type': expected \"function\", got null"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"tools\": [{\"type\": \"function\", "
     "\"function\": {\"description\": \"d\"}}]}",
     JOB_ERR_INVALID, "field 'tools[0].function.name': expected the function's name, got null"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"tools\": [{\"type\": \"function\", "
     "\"function\": {\"name\": \"f\", \"parameters\": []}}]}",
     JOB_ERR_INVALID, "field 'tools[0].function.parameters': expected a JSON Schema object, got []"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"documents\": [1]}", JOB_ERR_INVALID,
     "field 'documents[0]': expected an object, got 1"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"chat_template_kwargs\": []}",
     JOB_ERR_INVALID, "field 'chat_template_kwargs': expected an object"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"chat_template_kwargs\": "
     "{\"enable_thinking\": \"no\"}}",
     JOB_ERR_INVALID, "field 'chat_template_kwargs.enable_thinking': expected true or false"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"chat_template_kwargs\": "
     "{\"messages\": []}}",
     JOB_ERR_INVALID, "field 'chat_template_kwargs.messages': set by the job itself, not here"},
    {"{\"prompt\": \"a\", \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]}",
     JOB_ERR_INVALID, "field 'tools': only used with 'messages' or 'template'"},
    {"{\"prompt\": \"a\", \"chat_template_kwargs\": {\"x\": 1}}", JOB_ERR_INVALID,
     "field 'chat_template_kwargs': only used with 'messages' or 'template'"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", \"image_url\": {}}]}]}",
     JOB_ERR_INVALID,
     "field 'messages[0].content[0].type': only text parts are supported, got \"image_url\""},
    {"{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\"}]}]}", JOB_ERR_INVALID,
     "field 'messages[0].content[0].text': expected a string"},
    /* numbers */
    {"{\"prompt\": \"a\", \"max_tokens\": -3}", JOB_ERR_INVALID,
     "field 'max_tokens': expected an integer between 1 and 2147483647, got -3"},
    {"{\"prompt\": \"a\", \"max_tokens\": 0}", JOB_ERR_INVALID, "field 'max_tokens': expected an integer"},
    {"{\"prompt\": \"a\", \"max_tokens\": 2.5}", JOB_ERR_INVALID, "got 2.5"},
    {"{\"prompt\": \"a\", \"max_tokens\": \"5\"}", JOB_ERR_INVALID, "got \"5\""},
    {"{\"prompt\": \"a\", \"max_tokens\": 99999999999}", JOB_ERR_INVALID, "field 'max_tokens'"},
    {"{\"prompt\": \"a\", \"max_tokens\": true}", JOB_ERR_INVALID, "got true"},
    {"{\"prompt\": \"a\", \"min_tokens\": -1}", JOB_ERR_INVALID, "field 'min_tokens'"},
    {"{\"prompt\": \"a\", \"thinking_budget\": -1}", JOB_ERR_INVALID,
     "field 'thinking_budget': expected an integer between 0 and 2147483647, got -1"},
    {"{\"prompt\": \"a\", \"thinking_budget\": 1.5}", JOB_ERR_INVALID, "field 'thinking_budget'"},
    {"{\"prompt\": \"a\", \"thinking_budget\": \"64\"}", JOB_ERR_INVALID, "field 'thinking_budget'"},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": [{\"role\": "
     "\"user\", \"content\": \"a\"}], \"thinking_budget\": -5}}",
     JOB_ERR_INVALID, "field 'body.thinking_budget'"},
    {"{\"prompt\": \"a\", \"stop_in_reasoning\": \"yes\"}", JOB_ERR_INVALID, "field 'stop_in_reasoning'"},
    {"{\"prompt\": \"a\", \"max_tokens\": 4, \"min_tokens\": 5}", JOB_ERR_INVALID,
     "field 'min_tokens': 5 is over max_tokens (4)"},
    {"{\"prompt\": \"a\", \"temperature\": -0.1}", JOB_ERR_INVALID,
     "field 'temperature': expected a number between 0 and 100, got -0.1"},
    {"{\"prompt\": \"a\", \"temperature\": 101}", JOB_ERR_INVALID, "field 'temperature'"},
    {"{\"prompt\": \"a\", \"temperature\": \"hot\"}", JOB_ERR_INVALID, "got \"hot\""},
    {"{\"prompt\": \"a\", \"top_p\": 0}", JOB_ERR_INVALID,
     "field 'top_p': expected a number in (0, 1], got 0"},
    {"{\"prompt\": \"a\", \"top_p\": 1.5}", JOB_ERR_INVALID, "field 'top_p'"},
    {"{\"prompt\": \"a\", \"top_k\": -2}", JOB_ERR_INVALID,
     "field 'top_k': expected an integer between -1 and"},
    {"{\"prompt\": \"a\", \"top_k\": 1.5}", JOB_ERR_INVALID, "field 'top_k'"},
    {"{\"prompt\": \"a\", \"min_p\": 1.01}", JOB_ERR_INVALID,
     "field 'min_p': expected a number between 0 and 1"},
    {"{\"prompt\": \"a\", \"min_p\": -0.01}", JOB_ERR_INVALID, "field 'min_p'"},
    {"{\"prompt\": \"a\", \"presence_penalty\": 2.5}", JOB_ERR_INVALID,
     "field 'presence_penalty': expected a number between -2 and 2"},
    {"{\"prompt\": \"a\", \"frequency_penalty\": -3}", JOB_ERR_INVALID, "field 'frequency_penalty'"},
    {"{\"prompt\": \"a\", \"repetition_penalty\": 0}", JOB_ERR_INVALID,
     "field 'repetition_penalty': expected a number > 0, got 0"},
    {"{\"prompt\": \"a\", \"seed\": 1.5}", JOB_ERR_INVALID, "field 'seed': expected an integer, got 1.5"},
    {"{\"prompt\": \"a\", \"seed\": \"42\"}", JOB_ERR_INVALID, "field 'seed'"},
    {"{\"prompt\": \"a\", \"logprobs\": 21}", JOB_ERR_INVALID,
     "field 'logprobs': expected an integer between 0 and 20, got 21"},
    {"{\"prompt\": \"a\", \"logprobs\": -1}", JOB_ERR_INVALID, "field 'logprobs'"},
    /* deadline and priority */
    {"{\"prompt\": \"a\", \"timeout_s\": 0}", JOB_ERR_INVALID,
     "field 'timeout_s': expected a number in (0, 604800], got 0"},
    {"{\"prompt\": \"a\", \"timeout_s\": -1}", JOB_ERR_INVALID, "field 'timeout_s'"},
    {"{\"prompt\": \"a\", \"timeout_s\": 1e9}", JOB_ERR_INVALID, "field 'timeout_s'"},
    {"{\"prompt\": \"a\", \"timeout_s\": \"30\"}", JOB_ERR_INVALID, "got \"30\""},
    {"{\"prompt\": \"a\", \"timeout\": 30}", JOB_ERR_INVALID,
     "unknown field 'timeout' (did you mean 'timeout_s'?)"},
    {"{\"prompt\": \"a\", \"priority\": 0.5}", JOB_ERR_INVALID,
     "field 'priority': expected an integer between -1000 and 1000, got 0.5"},
    {"{\"prompt\": \"a\", \"priority\": 1001}", JOB_ERR_INVALID, "field 'priority'"},
    {"{\"prompt\": \"a\", \"priority\": \"high\"}", JOB_ERR_INVALID, "got \"high\""},
    {"{\"prompt\": \"a\", \"priorty\": 1}", JOB_ERR_INVALID,
     "unknown field 'priorty' (did you mean 'priority'?)"},
    /* stop */
    {"{\"prompt\": \"a\", \"stop\": 5}", JOB_ERR_INVALID,
     "field 'stop': expected a string or a list of strings, got 5"},
    {"{\"prompt\": \"a\", \"stop\": \"\"}", JOB_ERR_INVALID, "field 'stop': a stop string must not be empty"},
    {"{\"prompt\": \"a\", \"stop\": [\"x\", 3]}", JOB_ERR_INVALID,
     "field 'stop[1]': expected a string, got 3"},
    {"{\"prompt\": \"a\", \"stop\": "
     "[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\",\"11\",\"12\",\"13\","
     "\"14\",\"15\",\"16\",\"17\"]}",
     JOB_ERR_INVALID, "at most 16 stop strings (17 given)"},
    {"{\"prompt\": \"a\", \"stop_token_ids\": 5}", JOB_ERR_INVALID,
     "field 'stop_token_ids': expected a list of token ids"},
    {"{\"prompt\": \"a\", \"stop_token_ids\": [1, -1]}", JOB_ERR_INVALID,
     "field 'stop_token_ids[1]': expected an integer between 0 and"},
    /* booleans and objects */
    {"{\"prompt\": \"a\", \"return_token_ids\": 1}", JOB_ERR_INVALID,
     "field 'return_token_ids': expected true or false, got 1"},
    {"{\"prompt\": \"a\", \"enable_thinking\": \"no\"}", JOB_ERR_INVALID, "field 'enable_thinking'"},
    {"{\"prompt\": \"a\", \"ignore_eos\": 0}", JOB_ERR_INVALID, "field 'ignore_eos'"},
    {"{\"prompt\": \"a\", \"skip_special_tokens\": \"yes\"}", JOB_ERR_INVALID, "field 'skip_special_tokens'"},
    {"{\"prompt\": \"a\", \"metadata\": [1]}", JOB_ERR_INVALID,
     "field 'metadata': expected an object, got [1]"},
    {"{\"template\": 5}", JOB_ERR_INVALID, "field 'template': expected the name of a template"},
    /* OpenAI lines */
    {"{\"method\": \"POST\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"a\"}}", JOB_ERR_INVALID,
     "missing field 'custom_id'"},
    {"{\"custom_id\": 3, \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"a\"}}", JOB_ERR_INVALID,
     "field 'custom_id': expected a string, got 3"},
    {"{\"custom_id\": \"c\", \"method\": \"GET\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": "
     "\"a\"}}",
     JOB_ERR_INVALID, "field 'method': expected \"POST\", got \"GET\""},
    {"{\"custom_id\": \"c\", \"body\": {\"prompt\": \"a\"}}", JOB_ERR_INVALID, "missing field 'url'"},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/embeddings\", \"body\": {\"input\": \"a\"}}", JOB_ERR_INVALID,
     "field 'url': not supported"},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/completions\"}", JOB_ERR_INVALID, "missing field 'body'"},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/completions\", \"body\": []}", JOB_ERR_INVALID,
     "field 'body': expected an object"},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"a\"}, \"bdy\": 1}",
     JOB_ERR_INVALID, "unknown field 'bdy' (did you mean 'body'?)"},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/completions\", \"body\": {}}", JOB_ERR_INVALID,
     "missing field 'body.prompt'"},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/chat/completions\", \"body\": {\"model\": \"m\"}}",
     JOB_ERR_INVALID, "missing field 'body.messages'"},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": [{\"role\": "
     "\"user\", "
     "\"content\": \"a\"}], \"n\": 2}}",
     JOB_ERR_INVALID, "field 'body.n': not supported by llmq (only 1 is accepted), got 2"},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": [{\"role\": "
     "\"user\", "
     "\"content\": \"a\"}], \"tools\": [{\"type\": \"function\"}]}}",
     JOB_ERR_INVALID, "field 'body.tools[0].function': expected an object"},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": [{\"role\": "
     "\"user\", \"content\": \"a\"}], \"tool_choice\": \"required\"}}",
     JOB_ERR_INVALID,
     "field 'body.tool_choice': not supported by llmq (only \"auto\" and \"none\" are accepted"},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": [{\"role\": "
     "\"user\", "
     "\"content\": \"a\"}], \"stream\": \"yes\"}}",
     JOB_ERR_INVALID, "field 'body.stream'"},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": [{\"role\": "
     "\"user\", "
     "\"content\": \"a\"}], \"logit_bias\": {\"5\": 1}}}",
     JOB_ERR_INVALID, "field 'body.logit_bias'"},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": [{\"role\": "
     "\"user\", "
     "\"content\": \"a\"}], \"reasoning_effort\": \"low\"}}",
     JOB_ERR_INVALID, "field 'body.reasoning_effort': not supported by llmq"},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": [{\"role\": "
     "\"user\", "
     "\"content\": \"a\"}], \"top_logprobs\": 3}}",
     JOB_ERR_INVALID, "field 'body.top_logprobs': needs \"logprobs\": true, got 3"},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": [{\"role\": "
     "\"user\", "
     "\"content\": \"a\"}], \"logprobs\": 3}}",
     JOB_ERR_INVALID, "field 'body.logprobs': expected true or false, got 3"},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": [{\"role\": "
     "\"user\", "
     "\"content\": \"a\"}], \"max_tokens\": 0}}",
     JOB_ERR_INVALID, "field 'body.max_tokens': expected an integer"},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": [{\"role\": "
     "\"user\", "
     "\"content\": \"a\"}], \"chat_template_kwargs\": {\"tools\": 1}}}",
     JOB_ERR_INVALID,
     "field 'body.chat_template_kwargs.tools': set by the job itself, not here (use the job's field)"},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": [{\"role\": "
     "\"user\", "
     "\"content\": \"a\"}], \"prompt\": \"x\"}}",
     JOB_ERR_INVALID, "unknown field 'body.prompt'"},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": [{\"role\": "
     "\"user\", "
     "\"content\": \"a\"}], \"temprature\": 1}}",
     JOB_ERR_INVALID, "unknown field 'body.temprature' (did you mean 'temperature'?)"},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": [{\"role\": "
     "\"user\", "
     "\"content\": \"a\"}], \"return_token_ids\": true}}",
     JOB_ERR_INVALID, "unknown field 'body.return_token_ids'"},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": [{\"role\": "
     "\"system\", "
     "\"content\": [{\"type\": \"input_audio\"}]}]}}",
     JOB_ERR_INVALID, "field 'body.messages[0].content[0].type'"},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": [\"a\", \"b\"]}}",
     JOB_ERR_INVALID, "field 'body.prompt': only one prompt per request (2 given)"},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": []}}", JOB_ERR_INVALID,
     "field 'body.prompt'"},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": [1, -2]}}", JOB_ERR_INVALID,
     "field 'body.prompt[1]': expected a token id"},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"a\", \"echo\": true}}",
     JOB_ERR_INVALID, "field 'body.echo'"},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"a\", \"best_of\": 3}}",
     JOB_ERR_INVALID, "field 'body.best_of'"},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"a\", \"suffix\": \"z\"}}",
     JOB_ERR_INVALID, "field 'body.suffix'"},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"a\", \"logprobs\": 21}}",
     JOB_ERR_INVALID, "field 'body.logprobs': expected an integer between 0 and 20"},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"a\", \"logprobs\": "
     "true}}",
     JOB_ERR_INVALID, "field 'body.logprobs'"},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"a\", \"messages\": []}}",
     JOB_ERR_INVALID, "unknown field 'body.messages'"},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"a\", "
     "\"priority\": -2000}}",
     JOB_ERR_INVALID, "field 'body.priority': expected an integer between -1000 and 1000"},
    {"{\"custom_id\": \"c\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"a\"}, \"priority\": 1}",
     JOB_ERR_INVALID, "unknown field 'priority' (an OpenAI batch line has custom_id, method, url, body)"},
};

static void test_bad_lines(void **state)
{
    int failures = 0;
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        const struct bad_case *c = &bad_cases[i];
        struct job j;
        char err[512];
        int rc = parse(c->line, &j, err, sizeof err);
        if (rc != c->rc || !strstr(err, c->msg)) {
            printf("case %zu: %s\n  got rc %d, err \"%s\"\n  want rc %d, err containing \"%s\"\n", i, c->line,
                   rc, err, c->rc, c->msg);
            failures++;
        }
        job_free(&j);
    }
    assert_int_equal(failures, 0);
}

/* A failed line still tells its form and id, so the answer has the right shape. */
static void test_failed_line_keeps_form_and_id(void **state)
{
    struct job j;
    char err[256];
    assert_int_equal(parse("{\"id\": \"job-7\", \"prompt\": \"a\", \"max_tokens\": -3}", &j, err, sizeof err),
                     JOB_ERR_INVALID);
    assert_int_equal(j.form, JOB_FORM_LLMQ);
    assert_string_equal(j.id, "job-7");
    job_free(&j);
    assert_int_equal(
        parse("{\"custom_id\": \"req-1\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": 5}}", &j, err,
              sizeof err),
        JOB_ERR_INVALID);
    assert_int_equal(j.form, JOB_FORM_COMPLETION);
    assert_string_equal(j.id, "req-1");
    job_free(&j);
    /* not JSON, but it mentions custom_id: answered as an OpenAI line */
    assert_int_equal(parse("{\"custom_id\": \"req-2\", oops}", &j, err, sizeof err), JOB_ERR_JSON);
    assert_int_not_equal(j.form, JOB_FORM_LLMQ);
    assert_null(j.id);
    job_free(&j);
    assert_int_equal(parse("garbage", &j, err, sizeof err), JOB_ERR_JSON);
    assert_int_equal(j.form, JOB_FORM_LLMQ);
    job_free(&j);
}

static void test_size_and_depth_limits(void **state)
{
    struct job_opts o = job_opts_default();
    o.max_bytes = 64;
    struct job j;
    char err[256], line[256];
    snprintf(line, sizeof line, "{\"prompt\": \"%s\"}",
             "0123456789012345678901234567890123456789012345678901234567");
    assert_int_equal(job_parse(line, strlen(line), &o, &j, err, sizeof err), JOB_ERR_TOO_LARGE);
    assert_non_null(strstr(err, "over the limit of 64 (queues.max_job_bytes)"));
    job_free(&j);
    o.max_bytes = (int64_t)strlen(line); /* exactly at the limit is fine */
    assert_int_equal(job_parse(line, strlen(line), &o, &j, err, sizeof err), JOB_OK);
    job_free(&j);

    /* metadata nested JOB_MAX_DEPTH deep passes, one more level fails before jansson sees it */
    char deep[4096];
    for (int depth = JOB_MAX_DEPTH; depth <= JOB_MAX_DEPTH + 1; depth++) {
        size_t k = (size_t)snprintf(deep, sizeof deep, "{\"prompt\": \"a\", \"metadata\": ");
        for (int i = 1; i < depth; i++)
            k += (size_t)snprintf(deep + k, sizeof deep - k, "{\"a\": ");
        k += (size_t)snprintf(deep + k, sizeof deep - k, "1");
        for (int i = 0; i < depth; i++)
            deep[k++] = '}';
        deep[k] = 0;
        int rc = job_parse(deep, k, NULL, &j, err, sizeof err);
        if (depth == JOB_MAX_DEPTH) {
            assert_int_equal(rc, JOB_OK);
        } else {
            assert_int_equal(rc, JOB_ERR_JSON);
            assert_non_null(strstr(err, "nested deeper than 32 levels"));
        }
        job_free(&j);
    }
    /* brackets inside strings do not count */
    snprintf(deep, sizeof deep, "{\"prompt\": \"%s\"}",
             "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[{{{{");
    assert_int_equal(parse(deep, &j, err, sizeof err), JOB_OK);
    job_free(&j);
    /* the line need not be NUL-terminated */
    const char *two = "{\"prompt\": \"a\"}{\"prompt\": \"b\"}";
    assert_int_equal(job_parse(two, 15, NULL, &j, err, sizeof err), JOB_OK);
    assert_string_equal(j.prompt, "a");
    job_free(&j);
}

/* ---- good lines: every field lands where it should */

static void test_llmq_all_fields(void **state)
{
    const char *line =
        "{\"id\": \"doc-1\", \"prompt\": \"Hello\", \"max_tokens\": 64, \"temperature\": 0.7, "
        "\"top_p\": 0.9, \"top_k\": 40, \"min_p\": 0.05, \"seed\": -7, \"stop\": [\"\\n\\n\", \"END\"], "
        "\"stop_token_ids\": [151643, 7], \"presence_penalty\": 0.5, \"frequency_penalty\": -0.5, "
        "\"repetition_penalty\": 1.1, \"logprobs\": 5, \"return_token_ids\": true, "
        "\"enable_thinking\": false, \"ignore_eos\": true, \"min_tokens\": 3, "
        "\"thinking_budget\": 128, \"stop_in_reasoning\": true, "
        "\"skip_special_tokens\": false, \"metadata\": {\"source\": \"a.txt\", \"n\": [1, 2]}}";
    struct job j;
    char err[256];
    assert_int_equal(parse(line, &j, err, sizeof err), JOB_OK);
    assert_int_equal(j.form, JOB_FORM_LLMQ);
    assert_string_equal(j.id, "doc-1");
    assert_false(j.id_generated);
    assert_string_equal(j.prompt, "Hello");
    assert_null(j.messages);
    assert_int_equal(j.max_tokens, 64);
    assert_true(j.max_tokens_given);
    assert_float_equal(j.sp.temperature, 0.7f, 0);
    assert_float_equal(j.sp.top_p, 0.9f, 0);
    assert_int_equal(j.sp.top_k, 40);
    assert_float_equal(j.sp.min_p, 0.05f, 0);
    assert_true(j.has_seed);
    assert_true(j.sp.seed == (uint64_t)(int64_t)-7);
    assert_int_equal(j.n_stop, 2);
    assert_string_equal(j.stop[0], "\n\n");
    assert_string_equal(j.stop[1], "END");
    assert_int_equal(j.n_stop_ids, 2);
    assert_int_equal(j.stop_ids[0], 151643);
    assert_int_equal(j.stop_ids[1], 7);
    assert_float_equal(j.sp.presence_penalty, 0.5f, 0);
    assert_float_equal(j.sp.frequency_penalty, -0.5f, 0);
    assert_float_equal(j.sp.repetition_penalty, 1.1f, 0);
    assert_int_equal(j.sp.logprobs, 5);
    assert_true(j.return_token_ids);
    assert_false(j.enable_thinking);
    assert_true(j.ignore_eos);
    assert_int_equal(j.min_tokens, 3);
    assert_int_equal(j.thinking_budget, 128);
    assert_true(j.stop_in_reasoning);
    assert_false(j.skip_special_tokens);
    assert_non_null(j.metadata);
    assert_string_equal(json_string_value(json_object_get(j.metadata, "source")), "a.txt");

    json_t *params = job_params_json(&j);
    assert_non_null(params);
    assert_int_equal(json_integer_value(json_object_get(params, "max_tokens")), 64);
    assert_int_equal(json_integer_value(json_object_get(params, "seed")), -7);
    assert_int_equal(json_array_size(json_object_get(params, "stop")), 2);
    assert_int_equal(json_integer_value(json_object_get(params, "logprobs")), 5);
    assert_int_equal(json_integer_value(json_object_get(params, "thinking_budget")), 128);
    assert_true(json_is_true(json_object_get(params, "stop_in_reasoning")));
    json_decref(params);
    job_free(&j);
    /* absent: none, and not in the parameters */
    assert_int_equal(parse("{\"prompt\": \"a\"}", &j, err, sizeof err), JOB_OK);
    assert_int_equal(j.thinking_budget, -1);
    assert_false(j.stop_in_reasoning);
    params = job_params_json(&j);
    assert_null(json_object_get(params, "thinking_budget"));
    assert_null(json_object_get(params, "stop_in_reasoning"));
    json_decref(params);
    job_free(&j);
}

static void test_llmq_value_forms(void **state)
{
    struct job j;
    char err[256];
    /* a single stop string; integral floats as integers; nulls as absent; logprobs true/false */
    assert_int_equal(parse("{\"prompt\": \"a\", \"stop\": \"###\", \"max_tokens\": 8.0, \"top_k\": -1, "
                           "\"temperature\": null, \"seed\": null, \"logprobs\": true}",
                           &j, err, sizeof err),
                     JOB_OK);
    assert_int_equal(j.n_stop, 1);
    assert_string_equal(j.stop[0], "###");
    assert_int_equal(j.max_tokens, 8);
    assert_int_equal(j.sp.top_k, 0); /* -1 means off, as in vLLM */
    assert_float_equal(j.sp.temperature, 1.0f, 0);
    assert_false(j.has_seed);
    assert_int_equal(j.sp.logprobs, 0);
    assert_null(j.id);
    job_free(&j);
    assert_int_equal(parse("{\"prompt\": \"a\", \"logprobs\": false, \"stop\": []}", &j, err, sizeof err),
                     JOB_OK);
    assert_int_equal(j.sp.logprobs, -1);
    assert_int_equal(j.n_stop, 0);
    job_free(&j);
    /* tiny temperatures are greedy */
    assert_int_equal(parse("{\"prompt\": \"a\", \"temperature\": 0.000001}", &j, err, sizeof err), JOB_OK);
    assert_float_equal(j.sp.temperature, 0.0f, 0);
    job_free(&j);
    /* the edges of every range are inside it */
    assert_int_equal(
        parse("{\"prompt\": \"a\", \"temperature\": 100, \"top_p\": 1, \"min_p\": 1, "
              "\"presence_penalty\": -2, \"frequency_penalty\": 2, \"logprobs\": 20, \"min_tokens\": 0, "
              "\"max_tokens\": 2147483647, \"seed\": 9223372036854775807}",
              &j, err, sizeof err),
        JOB_OK);
    assert_int_equal(j.max_tokens, INT32_MAX);
    assert_true(j.sp.seed == (uint64_t)INT64_MAX);
    job_free(&j);
}

static void test_llmq_messages(void **state)
{
    struct job j;
    char err[256];
    const char *line = "{\"messages\": [{\"role\": \"developer\", \"content\": \"Be brief.\"}, "
                       "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"one\"}, "
                       "{\"type\": \"text\", \"text\": \"two\"}]}], \"enable_thinking\": false}";
    assert_int_equal(parse(line, &j, err, sizeof err), JOB_OK);
    assert_null(j.prompt);
    assert_int_equal(json_array_size(j.messages), 2);
    json_t *m0 = json_array_get(j.messages, 0), *m1 = json_array_get(j.messages, 1);
    assert_string_equal(json_string_value(json_object_get(m0, "role")), "system"); /* OpenAI's "developer" */
    assert_string_equal(json_string_value(json_object_get(m0, "content")), "Be brief.");
    assert_string_equal(json_string_value(json_object_get(m1, "role")), "user");
    assert_int_equal(json_array_size(json_object_get(m1, "content")), 2); /* parts kept for the template */
    assert_false(j.enable_thinking);
    assert_null(j.tools);
    assert_null(j.chat_kwargs);
    job_free(&j);

    /* tools, tool calls, tool results, reasoning, names, documents and kwargs pass through */
    const char *tools =
        "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris?\", \"name\": \"ann\"}, "
        "{\"role\": \"assistant\", \"reasoning_content\": \"Look it up.\", \"tool_calls\": [{\"id\": \"c1\", "
        "\"type\": \"function\", \"function\": {\"name\": \"weather\", \"arguments\": \"{\\\"city\\\": "
        "\\\"Paris\\\"}\"}}]}, "
        "{\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"18 C\"}], "
        "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"weather\", \"description\": \"d\", "
        "\"parameters\": {\"type\": \"object\"}}}], \"documents\": [{\"title\": \"t\", \"text\": \"x\"}], "
        "\"enable_thinking\": true, \"chat_template_kwargs\": {\"enable_thinking\": false, \"custom\": [1, "
        "2]}}";
    assert_int_equal(parse(tools, &j, err, sizeof err), JOB_OK);
    json_t *a = json_array_get(j.messages, 1);
    assert_true(
        json_is_null(json_object_get(a, "content"))); /* absent with tool calls: null, as OpenAI sends */
    assert_int_equal(json_array_size(json_object_get(a, "tool_calls")), 1);
    assert_int_equal(json_array_size(j.tools), 1);
    assert_int_equal(json_array_size(j.documents), 1);
    assert_false(j.enable_thinking); /* chat_template_kwargs.enable_thinking wins over enable_thinking */
    assert_null(json_object_get(j.chat_kwargs, "enable_thinking"));
    assert_int_equal(json_array_size(json_object_get(j.chat_kwargs, "custom")), 2);
    job_free(&j);

    /* "tools": [] is no tools (OpenAI clients send it for none) */
    const char *empty = "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"tools\": []}";
    assert_int_equal(parse(empty, &j, err, sizeof err), JOB_OK);
    assert_null(j.tools);
    job_free(&j);
}

static const char *find_template(void *ctx, const char *name)
{
    (void)ctx;
    if (!strcmp(name, "summarize"))
        return "Summarize {doc} in {n} words. {{literal}}";
    if (!strcmp(name, "broken"))
        return "Oops {doc";
    return NULL;
}

static void test_templates(void **state)
{
    struct job_opts o = job_opts_default();
    o.template_find = find_template;
    struct job j;
    char err[256];
    const char *ok =
        "{\"template\": \"summarize\", \"vars\": {\"doc\": \"the text\", \"n\": 0.1, \"unused\": 1}}";
    assert_int_equal(job_parse(ok, strlen(ok), &o, &j, err, sizeof err), JOB_OK);
    assert_int_equal(json_array_size(j.messages), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(j.messages, 0), "role")), "user");
    assert_string_equal(json_string_value(json_object_get(json_array_get(j.messages, 0), "content")),
                        "Summarize the text in 0.1 words. {literal}");
    job_free(&j);
    struct {
        const char *line, *msg;
    } bad[] = {
        {"{\"template\": \"summarize\", \"vars\": {\"doc\": \"x\"}}",
         "field 'vars': template 'summarize' needs 'n'"},
        {"{\"template\": \"summarize\"}", "needs 'doc'"},
        {"{\"template\": \"summarize\", \"vars\": {\"doc\": [1], \"n\": 1}}",
         "field 'vars.doc': expected a string or a number"},
        {"{\"template\": \"nope\"}", "field 'template': no template named 'nope' in the config"},
        {"{\"template\": \"broken\", \"vars\": {\"doc\": \"x\"}}",
         "template 'broken': unmatched '{' at byte 5"},
        {"{\"template\": \"summarize\", \"prompt\": \"x\"}", "exclude each other"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = job_parse(bad[i].line, strlen(bad[i].line), &o, &j, err, sizeof err);
        if (rc != JOB_ERR_INVALID || !strstr(err, bad[i].msg))
            fail_msg("%s: rc %d err \"%s\", want \"%s\"", bad[i].line, rc, err, bad[i].msg);
        job_free(&j);
    }
}

/* "document" with "summarize": options, the default templates, a configured one by name, errors. */
static void test_summarize_fields(void **state)
{
    struct job_opts o = job_opts_default();
    o.template_find = find_template;
    struct job j;
    char err[256];
    const char *plain = "{\"id\": \"d\", \"document\": \"A long text.\", \"summarize\": {}}";
    assert_int_equal(job_parse(plain, strlen(plain), &o, &j, err, sizeof err), JOB_OK);
    assert_non_null(j.summarize);
    assert_null(j.prompt);
    assert_null(j.messages);
    assert_string_equal(j.summarize->document, "A long text.");
    assert_int_equal(j.summarize->document_len, 12);
    assert_int_equal(j.summarize->chunk_tokens, 0);
    assert_int_equal(j.summarize->overlap_tokens, -1);
    assert_int_equal(j.summarize->max_tokens, 0);
    assert_string_equal(j.summarize->map_template, JOB_SUMMARIZE_MAP);
    assert_string_equal(j.summarize->map_text, job_summarize_map_text);
    assert_string_equal(j.summarize->reduce_text, job_summarize_reduce_text);
    json_t *params = job_params_json(&j);
    assert_string_equal(json_string_value(json_object_get(json_object_get(params, "summarize"), "map_template")),
                        JOB_SUMMARIZE_MAP);
    json_decref(params);
    job_drop_input(&j); /* keeps the document: the parts need it */
    assert_non_null(j.summarize->document);
    job_free(&j);

    const char *full = "{\"document\": \"x\", \"vars\": {\"n\": 3}, \"summarize\": {\"chunk_tokens\": 64, "
                       "\"overlap_tokens\": 0, \"max_tokens\": 20, \"map_template\": \"summarize\"}, "
                       "\"max_tokens\": 50, \"response_format\": {\"type\": \"json_object\"}}";
    assert_int_equal(job_parse(full, strlen(full), &o, &j, err, sizeof err), JOB_OK);
    assert_int_equal(j.summarize->chunk_tokens, 64);
    assert_int_equal(j.summarize->overlap_tokens, 0);
    assert_int_equal(j.summarize->max_tokens, 20);
    assert_int_equal(j.max_tokens, 50);
    assert_string_equal(j.summarize->map_text, "Summarize {doc} in {n} words. {{literal}}");
    assert_int_equal(json_integer_value(json_object_get(j.summarize->vars, "n")), 3);
    assert_int_equal(j.constraint.kind, JOB_CONSTRAINT_JSON_OBJECT);
    job_free(&j);
    const char *yes = "{\"document\": \"x\", \"summarize\": true}";
    assert_int_equal(job_parse(yes, strlen(yes), &o, &j, err, sizeof err), JOB_OK);
    job_free(&j);

    struct {
        const char *line, *msg;
    } bad[] = {
        {"{\"document\": \"x\"}", "field 'document': only used with 'summarize'"},
        {"{\"prompt\": \"x\", \"summarize\": {}}", "field 'summarize': needs the text in 'document'"},
        {"{\"document\": \"x\", \"prompt\": \"y\", \"summarize\": {}}", "exclude each other (2 given)"},
        {"{\"document\": \"\", \"summarize\": {}}", "field 'document': expected the document's text"},
        {"{\"document\": \"x\", \"summarize\": false}", "field 'summarize': expected an object of options"},
        {"{\"document\": \"x\", \"summarize\": {\"chunk\": 5}}", "field 'summarize.chunk': unknown key"},
        {"{\"document\": \"x\", \"summarize\": {\"chunk_tokens\": 8}}", "field 'summarize.chunk_tokens'"},
        {"{\"document\": \"x\", \"summarize\": {\"max_tokens\": 0}}", "field 'summarize.max_tokens'"},
        {"{\"document\": \"x\", \"summarize\": {\"overlap_tokens\": -1}}", "field 'summarize.overlap_tokens'"},
        {"{\"document\": \"x\", \"summarize\": {\"reduce_template\": \"nope\"}}",
         "field 'summarize.reduce_template': no template named 'nope' in the config"},
        {"{\"document\": \"x\", \"summarize\": {\"map_template\": \"broken\"}}",
         "field 'summarize.map_template': template 'broken': unmatched '{'"},
        {"{\"document\": \"x\", \"summarize\": {}, \"stream\": true}", "field 'stream': not supported with"},
        {"{\"document\": \"x\", \"summarize\": {}, \"logprobs\": 2}", "field 'logprobs': not supported with"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = job_parse(bad[i].line, strlen(bad[i].line), &o, &j, err, sizeof err);
        if (rc != JOB_ERR_INVALID || !strstr(err, bad[i].msg))
            fail_msg("%s: rc %d err \"%s\", want \"%s\"", bad[i].line, rc, err, bad[i].msg);
        job_free(&j);
    }
}

static void test_openai_chat(void **state)
{
    const char *line =
        "{\"custom_id\": \"request-1\", \"method\": \"POST\", \"url\": \"/v1/chat/completions\", \"body\": "
        "{\"model\": \"gpt-4o-mini\", \"messages\": [{\"role\": \"system\", \"content\": \"You are "
        "helpful.\"}, "
        "{\"role\": \"user\", \"content\": \"Hello world!\", \"name\": \"bob\"}], \"max_tokens\": 1000, "
        "\"max_completion_tokens\": 12, \"temperature\": 0, \"top_p\": 0.5, \"n\": 1, \"stop\": \"x\", "
        "\"seed\": 3, "
        "\"logprobs\": true, \"top_logprobs\": 4, \"presence_penalty\": 0.1, \"frequency_penalty\": 0.2, "
        "\"user\": \"u\", \"store\": false, \"stream\": false, \"tools\": [], \"tool_choice\": \"none\", "
        "\"response_format\": {\"type\": \"text\"}, \"logit_bias\": {}, \"parallel_tool_calls\": true, "
        "\"top_k\": 5, \"min_p\": 0.1, \"repetition_penalty\": 1.2, \"min_tokens\": 2, \"ignore_eos\": "
        "false, "
        "\"stop_token_ids\": [9], \"skip_special_tokens\": true, \"chat_template_kwargs\": "
        "{\"enable_thinking\": "
        "false}, \"metadata\": {\"k\": \"v\"}, \"service_tier\": \"auto\", \"stream_options\": null}}";
    struct job j;
    char err[256];
    assert_int_equal(parse(line, &j, err, sizeof err), JOB_OK);
    assert_int_equal(j.form, JOB_FORM_CHAT);
    assert_string_equal(j.id, "request-1");
    assert_int_equal(json_array_size(j.messages), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(j.messages, 1), "content")),
                        "Hello world!");
    assert_null(j.tools);               /* "tools": [] */
    assert_int_equal(j.max_tokens, 12); /* max_completion_tokens wins over the deprecated max_tokens */
    assert_float_equal(j.sp.temperature, 0.0f, 0);
    assert_float_equal(j.sp.top_p, 0.5f, 0);
    assert_int_equal(j.n_stop, 1);
    assert_true(j.has_seed);
    assert_true(j.sp.seed == 3);
    assert_int_equal(j.sp.logprobs, 4);
    assert_int_equal(j.sp.top_k, 5);
    assert_int_equal(j.min_tokens, 2);
    assert_int_equal(j.n_stop_ids, 1);
    assert_false(j.enable_thinking);
    assert_non_null(j.metadata);
    job_free(&j);

    /* logprobs true alone: the chosen token's only; no logprobs: none */
    const char *lp = "{\"custom_id\": \"r\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": "
                     "[{\"role\": \"user\", \"content\": \"a\"}], \"logprobs\": true}}";
    assert_int_equal(parse(lp, &j, err, sizeof err), JOB_OK);
    assert_int_equal(j.sp.logprobs, 0);
    assert_false(j.max_tokens_given);
    assert_false(j.stream); /* off unless asked */
    job_free(&j);

    /* stream: OpenAI's own field in the body, llmq's at the top */
    const char *st = "{\"custom_id\": \"r\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": "
                     "[{\"role\": \"user\", \"content\": \"a\"}], \"stream\": true}}";
    assert_int_equal(parse(st, &j, err, sizeof err), JOB_OK);
    assert_true(j.stream);
    job_free(&j);
    assert_int_equal(parse("{\"prompt\": \"a\", \"stream\": true}", &j, err, sizeof err), JOB_OK);
    assert_true(j.stream);
    job_free(&j);
    const char *nolp = "{\"custom_id\": \"r\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": "
                       "[{\"role\": \"user\", \"content\": \"a\"}], \"logprobs\": false, \"max_tokens\": 7}}";
    assert_int_equal(parse(nolp, &j, err, sizeof err), JOB_OK);
    assert_int_equal(j.sp.logprobs, -1);
    assert_int_equal(j.max_tokens, 7);
    assert_true(j.max_tokens_given);
    assert_true(j.enable_thinking); /* the default */
    job_free(&j);
}

static void test_openai_completion(void **state)
{
    struct job j;
    char err[256];
    const char *s = "{\"custom_id\": \"c1\", \"method\": \"POST\", \"url\": \"/v1/completions\", \"body\": "
                    "{\"model\": \"m\", \"prompt\": \"Once upon\", \"max_tokens\": 5, \"logprobs\": 2, "
                    "\"echo\": false, \"best_of\": 1, \"n\": 1, \"suffix\": null}}";
    assert_int_equal(parse(s, &j, err, sizeof err), JOB_OK);
    assert_int_equal(j.form, JOB_FORM_COMPLETION);
    assert_string_equal(j.prompt, "Once upon");
    assert_int_equal(j.sp.logprobs, 2);
    assert_int_equal(j.max_tokens, 5);
    job_free(&j);
    /* method may be left out; the prompt as [string], token ids, or [[token ids]] */
    const char *one =
        "{\"custom_id\": \"c\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": [\"hi\"]}}";
    assert_int_equal(parse(one, &j, err, sizeof err), JOB_OK);
    assert_string_equal(j.prompt, "hi");
    job_free(&j);
    const char *ids =
        "{\"custom_id\": \"c\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": [1, 2, 3]}}";
    assert_int_equal(parse(ids, &j, err, sizeof err), JOB_OK);
    assert_null(j.prompt);
    assert_int_equal(j.n_prompt_ids, 3);
    assert_int_equal(j.prompt_ids[2], 3);
    job_free(&j);
    const char *ids2 =
        "{\"custom_id\": \"c\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": [[4, 5]]}}";
    assert_int_equal(parse(ids2, &j, err, sizeof err), JOB_OK);
    assert_int_equal(j.n_prompt_ids, 2);
    assert_int_equal(j.prompt_ids[0], 4);
    job_free(&j);
}

/* ---- defaults: built-in < config < generation_config.json < the job */

static void test_defaults_precedence(void **state)
{
    struct job_defaults d = job_defaults_builtin();
    assert_int_equal(d.max_tokens, 256);
    assert_float_equal(d.temperature, 1.0f, 0);
    assert_true(d.enable_thinking);

    struct cfg_sampling s = {.max_tokens = 100,
                             .temperature = 0.5,
                             .top_p = 0.8,
                             .top_k = 20,
                             .min_p = 0.01,
                             .repetition_penalty = 1.05,
                             .presence_penalty = 0.3,
                             .frequency_penalty = 0.4,
                             .use_generation_config = true,
                             .enable_thinking = false};
    job_defaults_from_cfg(&d, &s);
    assert_int_equal(d.max_tokens, 100);
    assert_float_equal(d.temperature, 0.5f, 1e-7);
    assert_float_equal(d.presence_penalty, 0.3f, 1e-7);
    assert_false(d.enable_thinking);

    /* generation_config.json: only the keys the file sets are taken (values as model_load read them) */
    char dir[256], path[300];
    assert_int_equal(scratch_dir_make(getenv("TMPDIR"), "test-job", dir, sizeof dir), 0);
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    struct model_config mc;
    memset(&mc, 0, sizeof mc);
    job_defaults_from_model(&d, &mc, dir); /* no file: nothing changes */
    assert_float_equal(d.temperature, 0.5f, 1e-7);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"eos_token_id\": 2, \"do_sample\": true}", f);
    fclose(f);
    job_defaults_from_model(&d, &mc, dir); /* no sampling keys: nothing changes */
    assert_float_equal(d.temperature, 0.5f, 1e-7);
    f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"temperature\": 0.6, \"top_p\": 0.95, \"top_k\": null, \"max_new_tokens\": 64}", f);
    fclose(f);
    mc.has_sampling_defaults = true;
    mc.gen_temperature = 0.6f;
    mc.gen_top_p = 0.95f;
    mc.gen_top_k = 0; /* absent from the file: model_load's neutral values */
    mc.gen_min_p = 0;
    mc.gen_repetition_penalty = 1.0f;
    job_defaults_from_model(&d, &mc, dir);
    remove(path);
    rmdir(dir);
    assert_float_equal(d.temperature, 0.6f, 0);
    assert_float_equal(d.top_p, 0.95f, 0);
    assert_int_equal(d.top_k, 20);            /* top_k: null in the file: the config's stays */
    assert_float_equal(d.min_p, 0.01f, 1e-7); /* absent from the file: the config's stays */
    assert_float_equal(d.repetition_penalty, 1.05f, 1e-7);
    assert_float_equal(d.presence_penalty, 0.3f, 1e-7); /* never in generation_config */
    assert_int_equal(d.max_tokens, 64);                 /* max_new_tokens */
    d.max_tokens = 100;

    struct job_opts o = job_opts_default();
    o.defaults = d;
    struct job j;
    char err[256];
    const char *line = "{\"prompt\": \"a\", \"top_p\": 0.5}";
    assert_int_equal(job_parse(line, strlen(line), &o, &j, err, sizeof err), JOB_OK);
    assert_float_equal(j.sp.top_p, 0.5f, 0);                /* the job */
    assert_float_equal(j.sp.temperature, 0.6f, 0);          /* generation_config */
    assert_float_equal(j.sp.frequency_penalty, 0.4f, 1e-7); /* the config */
    assert_int_equal(j.max_tokens, 100);
    assert_false(j.max_tokens_given);
    assert_false(j.enable_thinking);
    job_free(&j);
    /* a default max_tokens below min_tokens is still an error, and says it was the default */
    line = "{\"prompt\": \"a\", \"min_tokens\": 101}";
    assert_int_equal(job_parse(line, strlen(line), &o, &j, err, sizeof err), JOB_ERR_INVALID);
    assert_non_null(strstr(err, "over max_tokens (100, the default)"));
    job_free(&j);
}

static void test_ids(void **state)
{
    char a[JOB_ID_LEN + 1], b[JOB_ID_LEN + 1];
    uuid7(a);
    uuid7(b);
    assert_int_equal(strlen(a), JOB_ID_LEN);
    assert_string_not_equal(a, b);
    /* UUIDv7 layout: 8-4-4-4-12 hex, version 7, variant 10xx */
    for (int i = 0; i < JOB_ID_LEN; i++) {
        if (i == 8 || i == 13 || i == 18 || i == 23)
            assert_int_equal(a[i], '-');
        else
            assert_non_null(strchr("0123456789abcdef", a[i]));
    }
    assert_int_equal(a[14], '7');
    assert_non_null(strchr("89ab", a[19]));
    /* the first 48 bits are the Unix time in milliseconds */
    unsigned long long ms = strtoull(
        (char[]){a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[9], a[10], a[11], a[12], 0}, NULL, 16);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    unsigned long long now = (unsigned long long)ts.tv_sec * 1000 + (unsigned long long)ts.tv_nsec / 1000000;
    assert_true(ms <= now && now - ms < 10000);
    assert_true(strncmp(a, b, 13) <= 0); /* the time part of a later id sorts after (same ms: random order) */

    struct job j;
    char err[64];
    assert_int_equal(parse("{\"prompt\": \"a\"}", &j, err, sizeof err), JOB_OK);
    assert_null(j.id);
    assert_int_equal(job_assign_id(&j), 0);
    assert_non_null(j.id);
    assert_true(j.id_generated);
    assert_int_equal(strlen(j.id), JOB_ID_LEN);
    job_free(&j);
    assert_int_equal(parse("{\"id\": \"mine\", \"prompt\": \"a\"}", &j, err, sizeof err), JOB_OK);
    assert_int_equal(job_assign_id(&j), 0);
    assert_string_equal(j.id, "mine");
    assert_false(j.id_generated);
    job_free(&j);
    job_free(NULL);
}

/* timeout_s and priority in both forms (OpenAI: in the body), their params, the deadline and the
 * timeout message. */
static void test_scheduling_fields(void **state)
{
    struct job j;
    char err[256];
    assert_int_equal(parse("{\"prompt\": \"a\", \"timeout_s\": 2.5, \"priority\": -1}", &j, err, sizeof err),
                     JOB_OK);
    assert_true(j.timeout_s == 2.5);
    assert_int_equal(j.priority, -1);
    assert_true(job_deadline(&j, 100) == 102.5);
    json_t *params = job_params_json(&j);
    assert_true(json_real_value(json_object_get(params, "timeout_s")) == 2.5);
    assert_int_equal(json_integer_value(json_object_get(params, "priority")), -1);
    json_decref(params);
    job_timeout_error(&j, 17, err, sizeof err);
    assert_string_equal(err, "timeout_s (2.5 s) passed after 17 generated tokens; the text so far is kept");
    job_free(&j);
    /* absent: no deadline, priority 0, neither in params */
    assert_int_equal(
        parse("{\"prompt\": \"a\", \"timeout_s\": null, \"priority\": 7.0}", &j, err, sizeof err), JOB_OK);
    assert_true(job_deadline(&j, 100) == 0);
    assert_int_equal(j.priority, 7);
    params = job_params_json(&j);
    assert_null(json_object_get(params, "timeout_s"));
    json_decref(params);
    job_free(&j);
    static const char *const openai[] = {
        "{\"custom_id\": \"r\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": [{\"role\": "
        "\"user\", \"content\": \"a\"}], \"timeout_s\": 30, \"priority\": 2}}",
        "{\"custom_id\": \"r\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"a\", "
        "\"timeout_s\": 30, \"priority\": 2}}",
    };
    for (int i = 0; i < 2; i++) {
        assert_int_equal(parse(openai[i], &j, err, sizeof err), JOB_OK);
        assert_true(j.timeout_s == 30);
        assert_int_equal(j.priority, 2);
        job_free(&j);
    }
}

/* ---- structured output: response_format, regex, choice */

#define CHAT_LINE(body_extra)                                                                                \
    "{\"custom_id\": \"c\", \"url\": \"/v1/chat/completions\", \"body\": {\"messages\": [{\"role\": "        \
    "\"user\", \"content\": \"a\"}], " body_extra "}}"
#define COMPL_LINE(body_extra)                                                                               \
    "{\"custom_id\": \"c\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": \"a\", " body_extra "}}"
#define SCHEMA_RF(schema)                                                                                    \
    "\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"doc\", "                 \
    "\"schema\": " schema ", \"strict\": true}}"
#define SIX_FIELDS                                                                                           \
    "{\"type\": \"object\", \"properties\": {\"title\": {\"type\": \"string\"}, \"sentiment\": {\"enum\": "  \
    "[\"pos\", \"neg\"]}}, \"required\": [\"title\", \"sentiment\"], \"additionalProperties\": false}"

/* json_schema in all three forms: the schema is kept as given, its hash is js_hash's, the name and
 * strict are read; key order and spacing do not change the hash. */
static void test_constraint_json_schema(void **state)
{
    struct job j;
    char err[512];
    const char *lines[] = {
        "{\"prompt\": \"a\", " SCHEMA_RF(SIX_FIELDS) "}",
        CHAT_LINE(SCHEMA_RF(SIX_FIELDS)),
        COMPL_LINE(SCHEMA_RF(SIX_FIELDS)),
    };
    json_t *want = json_loads(SIX_FIELDS, 0, NULL);
    assert_non_null(want);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(parse(lines[i], &j, err, sizeof err), JOB_OK);
        assert_int_equal(j.constraint.kind, JOB_CONSTRAINT_JSON_SCHEMA);
        assert_true(json_equal(j.constraint.schema, want));
        assert_true(j.constraint.schema_hash == js_hash(want));
        assert_string_equal(j.constraint.name, "doc");
        assert_true(j.constraint.strict);
        assert_true(job_constraint_is_json(j.constraint.kind));
        json_t *p = job_params_json(&j);
        assert_string_equal(json_string_value(json_object_get(p, "constraint")), "json_schema");
        json_decref(p);
        job_free(&j);
        assert_null(j.constraint.schema); /* freed and zeroed */
    }
    /* same schema, other key order and spacing: same hash; strict absent is false */
    assert_int_equal(
        parse("{\"prompt\": \"a\", \"response_format\": {\"json_schema\": {\"schema\": "
              "{\"required\":[\"title\",\"sentiment\"],\"additionalProperties\":false,"
              "\"properties\":{\"sentiment\":{\"enum\":[\"pos\",\"neg\"]},\"title\":{\"type\":"
              "\"string\"}},\"type\":\"object\"}, \"name\": \"x-1_B\"}, \"type\": \"json_schema\"}}",
              &j, err, sizeof err),
        JOB_OK);
    assert_true(j.constraint.schema_hash == js_hash(want));
    assert_false(j.constraint.strict);
    assert_string_equal(j.constraint.name, "x-1_B");
    /* the constraint outlives job_drop_input (the worker builds the result after it) */
    job_drop_input(&j);
    assert_int_equal(j.constraint.kind, JOB_CONSTRAINT_JSON_SCHEMA);
    assert_non_null(j.constraint.schema);
    job_free(&j);
    json_decref(want);
}

/* json_object, text, regex and choice, in llmq's form and in OpenAI bodies. */
static void test_constraint_other_kinds(void **state)
{
    struct job j;
    char err[512];
    const char *objects[] = {"{\"prompt\": \"a\", \"response_format\": {\"type\": \"json_object\"}}",
                             CHAT_LINE("\"response_format\": {\"type\": \"json_object\"}"),
                             COMPL_LINE("\"response_format\": {\"type\": \"json_object\"}")};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(parse(objects[i], &j, err, sizeof err), JOB_OK);
        assert_int_equal(j.constraint.kind, JOB_CONSTRAINT_JSON_OBJECT);
        assert_null(j.constraint.schema);
        job_free(&j);
    }
    const char *texts[] = {
        "{\"prompt\": \"a\", \"response_format\": {\"type\": \"text\"}}",
        CHAT_LINE("\"response_format\": {\"type\": \"text\"}"),
        "{\"prompt\": \"a\", \"response_format\": null, \"regex\": null, \"choice\": null}",
        "{\"prompt\": \"a\"}"};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(parse(texts[i], &j, err, sizeof err), JOB_OK);
        assert_int_equal(j.constraint.kind, JOB_CONSTRAINT_NONE);
        json_t *p = job_params_json(&j);
        assert_null(json_object_get(p, "constraint"));
        json_decref(p);
        job_free(&j);
    }
    assert_int_equal(parse("{\"prompt\": \"a\", \"regex\": \"[0-9]{3}-[a-z]+\"}", &j, err, sizeof err),
                     JOB_OK);
    assert_int_equal(j.constraint.kind, JOB_CONSTRAINT_REGEX);
    assert_string_equal(j.constraint.regex, "[0-9]{3}-[a-z]+");
    assert_false(job_constraint_is_json(j.constraint.kind));
    job_free(&j);
    assert_int_equal(parse(CHAT_LINE("\"regex\": \"yes|no\""), &j, err, sizeof err), JOB_OK);
    assert_string_equal(j.constraint.regex, "yes|no");
    job_free(&j);
    assert_int_equal(parse("{\"prompt\": \"a\", \"choice\": [\"positive\", \"negative\", \"n\\u00e9utre\"]}",
                           &j, err, sizeof err),
                     JOB_OK);
    assert_int_equal(j.constraint.kind, JOB_CONSTRAINT_CHOICE);
    assert_int_equal(j.constraint.n_choices, 3);
    assert_string_equal(j.constraint.choices[0], "positive");
    assert_string_equal(j.constraint.choices[2], "n\xc3\xa9utre");
    job_free(&j);
    assert_int_equal(parse(COMPL_LINE("\"choice\": [\"A\"]"), &j, err, sizeof err), JOB_OK);
    assert_int_equal(j.constraint.n_choices, 1);
    job_free(&j);
    /* JOB_MAX_CHOICES is allowed, one more is not */
    for (int n = JOB_MAX_CHOICES; n <= JOB_MAX_CHOICES + 1; n++) {
        json_t *line = json_pack("{s:s}", "prompt", "a"), *ch = json_array();
        for (int i = 0; i < n; i++) {
            char c[16];
            snprintf(c, sizeof c, "c%d", i);
            json_array_append_new(ch, json_string(c));
        }
        json_object_set_new(line, "choice", ch);
        char *text = json_dumps(line, JSON_COMPACT);
        int rc = parse(text, &j, err, sizeof err);
        if (n == JOB_MAX_CHOICES) {
            assert_int_equal(rc, JOB_OK);
            assert_int_equal(j.constraint.n_choices, JOB_MAX_CHOICES);
        } else {
            assert_int_equal(rc, JOB_ERR_RESPONSE_FORMAT);
            assert_non_null(strstr(err, "field 'choice': at most 1024 choices (1025 given)"));
        }
        job_free(&j);
        free(text);
        json_decref(line);
    }
    assert_string_equal(job_constraint_name(JOB_CONSTRAINT_JSON_OBJECT), "json_object");
    assert_string_equal(job_constraint_name(JOB_CONSTRAINT_REGEX), "regex");
    assert_string_equal(job_constraint_name(JOB_CONSTRAINT_CHOICE), "choice");
    assert_null(job_constraint_name(JOB_CONSTRAINT_NONE));
}

/* Each bad constraint fails with invalid_response_format and a message naming the field (and, for a
 * refused schema, js_compile's keyword and JSON pointer). */
static void test_constraint_errors(void **state)
{
    static const struct bad_case cases[] = {
        /* a schema js_compile refuses: keyword and pointer */
        {"{\"prompt\": \"a\", " SCHEMA_RF(
             "{\"type\": \"object\", \"properties\": {\"tags\": {\"type\": \"object\", "
             "\"patternProperties\": {}}}}") "}",
         JOB_ERR_RESPONSE_FORMAT,
         "field 'response_format.json_schema.schema': unsupported keyword 'patternProperties' at "
         "/properties/tags"},
        {CHAT_LINE(SCHEMA_RF("{\"type\": \"array\", \"items\": {\"$ref\": \"#/$defs/nope\"}}")),
         JOB_ERR_RESPONSE_FORMAT,
         "field 'body.response_format.json_schema.schema': unresolved $ref '#/$defs/nope' at /items"},
        {COMPL_LINE(SCHEMA_RF("{\"type\": \"strin\"}")), JOB_ERR_RESPONSE_FORMAT,
         "field 'body.response_format.json_schema.schema': unsupported type 'strin' at /"},
        {"{\"prompt\": \"a\", " SCHEMA_RF("{\"minItems\": 3, \"maxItems\": 2}") "}", JOB_ERR_RESPONSE_FORMAT,
         "bad value of 'minItems' at /: greater than maxItems"},
        /* what the grammar compilers refuse is refused at parse (and so at enqueue) too */
        {"{\"prompt\": \"a\", " SCHEMA_RF("{\"type\": \"string\", \"pattern\": \"^a$\", \"format\": \"date\"}") "}",
         JOB_ERR_RESPONSE_FORMAT, "field 'response_format.json_schema.schema': "},
        {"{\"prompt\": \"a\", \"regex\": \"(?=a)a\"}", JOB_ERR_RESPONSE_FORMAT,
         "field 'regex': regex: unsupported lookahead at offset 0"},
        /* the shape of response_format */
        {"{\"prompt\": \"a\", \"response_format\": \"json\"}", JOB_ERR_RESPONSE_FORMAT,
         "field 'response_format': expected {\"type\": \"text\" | \"json_object\" | \"json_schema\", ...}, "
         "got "
         "\"json\""},
        {"{\"prompt\": \"a\", \"response_format\": {}}", JOB_ERR_RESPONSE_FORMAT,
         "field 'response_format.type': expected \"text\", \"json_object\" or \"json_schema\", got null"},
        {"{\"prompt\": \"a\", \"response_format\": {\"type\": \"xml\"}}", JOB_ERR_RESPONSE_FORMAT,
         "field 'response_format.type': expected \"text\", \"json_object\" or \"json_schema\", got \"xml\""},
        {"{\"prompt\": \"a\", \"response_format\": {\"type\": \"json_object\", \"schema\": {}}}",
         JOB_ERR_RESPONSE_FORMAT, "field 'response_format.schema': unknown key"},
        {"{\"prompt\": \"a\", \"response_format\": {\"type\": \"json_schema\"}}", JOB_ERR_RESPONSE_FORMAT,
         "field 'response_format.json_schema': expected an object {\"name\", \"schema\", \"strict\"?}, got "
         "null"},
        {"{\"prompt\": \"a\", \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"schema\": "
         "{}}}}",
         JOB_ERR_RESPONSE_FORMAT, "field 'response_format.json_schema.name': missing"},
        {"{\"prompt\": \"a\", \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": "
         "\"a b\", "
         "\"schema\": {}}}}",
         JOB_ERR_RESPONSE_FORMAT,
         "field 'response_format.json_schema.name': expected 1 to 64 letters, digits, '_' or '-', got \"a "
         "b\""},
        {"{\"prompt\": \"a\", \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": "
         "\"n\"}}}",
         JOB_ERR_RESPONSE_FORMAT, "field 'response_format.json_schema.schema': missing"},
        {"{\"prompt\": \"a\", \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": "
         "\"n\", "
         "\"schema\": true}}}",
         JOB_ERR_RESPONSE_FORMAT,
         "field 'response_format.json_schema.schema': expected a JSON Schema object, got true"},
        {"{\"prompt\": \"a\", \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": "
         "\"n\", "
         "\"schema\": {}, \"strict\": \"yes\"}}}",
         JOB_ERR_RESPONSE_FORMAT, "field 'response_format.json_schema.strict': expected true or false"},
        {"{\"prompt\": \"a\", \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": "
         "\"n\", "
         "\"schema\": {}, \"schema_\": 1}}}",
         JOB_ERR_RESPONSE_FORMAT, "field 'response_format.json_schema.schema_': unknown key"},
        /* regex and choice */
        {"{\"prompt\": \"a\", \"regex\": \"\"}", JOB_ERR_RESPONSE_FORMAT,
         "field 'regex': expected a non-empty string"},
        {"{\"prompt\": \"a\", \"regex\": 5}", JOB_ERR_RESPONSE_FORMAT,
         "field 'regex': expected a non-empty string, got 5"},
        {"{\"prompt\": \"a\", \"regex\": \"a\\u0000b\"}", JOB_ERR_JSON, "invalid JSON"},
        {"{\"prompt\": \"a\", \"choice\": []}", JOB_ERR_RESPONSE_FORMAT,
         "field 'choice': expected a non-empty list of strings, got []"},
        {"{\"prompt\": \"a\", \"choice\": \"yes\"}", JOB_ERR_RESPONSE_FORMAT,
         "field 'choice': expected a non-empty list"},
        {"{\"prompt\": \"a\", \"choice\": [\"yes\", \"\"]}", JOB_ERR_RESPONSE_FORMAT,
         "field 'choice[1]': expected a non-empty string"},
        {"{\"prompt\": \"a\", \"choice\": [\"yes\", 1]}", JOB_ERR_RESPONSE_FORMAT,
         "field 'choice[1]': expected a non-empty string, got 1"},
        {CHAT_LINE("\"choice\": [null]"), JOB_ERR_RESPONSE_FORMAT,
         "field 'body.choice[0]': expected a non-empty string"},
        /* two constraints at once, in either order and either form */
        {"{\"prompt\": \"a\", \"regex\": \"x\", \"choice\": [\"x\"]}", JOB_ERR_RESPONSE_FORMAT,
         "fields 'regex' and 'choice' exclude each other (one constraint per job"},
        {"{\"prompt\": \"a\", \"choice\": [\"x\"], \"response_format\": {\"type\": \"json_object\"}}",
         JOB_ERR_RESPONSE_FORMAT, "fields 'choice' and 'response_format' exclude each other"},
        {CHAT_LINE(SCHEMA_RF("{}") ", \"regex\": \"x\""), JOB_ERR_RESPONSE_FORMAT,
         "fields 'body.response_format' and 'body.regex' exclude each other"},
        {"{\"prompt\": \"a\", \"regex\": \"x\", \"response_format\": {\"type\": \"json_schema\", "
         "\"json_schema\": "
         "{\"name\": \"n\", \"schema\": {}}}}",
         JOB_ERR_RESPONSE_FORMAT, "fields 'regex' and 'response_format' exclude each other"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct job j;
        char err[512];
        int rc = parse(cases[i].line, &j, err, sizeof err);
        if (rc != cases[i].rc || !strstr(err, cases[i].msg))
            fail_msg("case %zu: %s\n  rc %d (want %d)\n  err: %s\n  want: %s", i, cases[i].line, rc,
                     cases[i].rc, err, cases[i].msg);
        job_free(&j);
    }
    /* a text response_format does not count as a constraint */
    struct job j;
    char err[512];
    assert_int_equal(parse("{\"prompt\": \"a\", \"response_format\": {\"type\": \"text\"}, \"regex\": \"x\"}",
                           &j, err, sizeof err),
                     JOB_OK);
    assert_int_equal(j.constraint.kind, JOB_CONSTRAINT_REGEX);
    job_free(&j);
}

/* The table of failure codes: every kind has its own code, the codes are the ones
 * result.schema.json lists (no more, no fewer), and the codes the Lua scripts write are in it. */
static void test_error_codes(void **state)
{
    assert_string_equal(job_error_code(JOB_OK), "");
    assert_string_equal(job_error_code(JOB_ERR_JSON), "invalid_json");
    assert_string_equal(job_error_code(JOB_ERR_TOO_LARGE), "job_too_large");
    assert_string_equal(job_error_code(JOB_ERR_INVALID), "invalid_request");
    assert_string_equal(job_error_code(JOB_ERR_CONTEXT), "context_length_exceeded");
    assert_string_equal(job_error_code(JOB_ERR_ENGINE), "engine_error");
    assert_string_equal(job_error_code(JOB_ERR_TIMEOUT), "timeout");
    assert_string_equal(job_error_code(JOB_ERR_CANCELLED), "cancelled");
    assert_string_equal(job_error_code(JOB_ERR_INTERNAL), "internal");
    assert_string_equal(job_error_code(JOB_ERR_STALLS), "max_stalls_exceeded");
    assert_string_equal(job_error_code(JOB_ERR_TEMPLATE), "template_error");
    assert_string_equal(job_error_code(JOB_ERR_RESPONSE_FORMAT), "invalid_response_format");
    assert_string_equal(job_error_code(-1000), "internal");
    json_t *schema = json_load_file(test_source("schemas/result.schema.json"), 0, NULL);
    assert_non_null(schema);
    json_t *codes = json_object_get(json_object_get(json_object_get(schema, "$defs"), "error_code"), "enum");
    assert_int_equal(json_array_size(codes), JOB_ERR_COUNT);
    for (int k = 1; k <= JOB_ERR_COUNT; k++) {
        const char *c = job_error_code(-k);
        for (int m = 1; m < k; m++)
            if (!strcmp(c, job_error_code(-m)))
                fail_msg("kinds %d and %d share the code %s", -m, -k, c);
        bool listed = false;
        for (size_t i = 0; i < json_array_size(codes); i++)
            listed |= !strcmp(json_string_value(json_array_get(codes, i)), c);
        if (!listed)
            fail_msg("code %s is not in result.schema.json's error_code", c);
    }
    json_decref(schema);
    const char *reap = rq_script_source(RQ_SCRIPT_REAP);
    assert_non_null(strstr(reap, "'max_stalls_exceeded'"));
}

/* ---- job_prepare with the real Qwen3 tokenizer (skipped when the asset could not be fetched) */

static struct tok *qwen3_tok(void)
{
    const char *dir = getenv("LLMQ_ASSETS");
    char path[4096], err[512];
    if (!dir)
        return NULL;
    snprintf(path, sizeof path, "%s/qwen3-tokenizer", dir);
    struct tok *t = tok_load_dir(path, err, sizeof err);
    if (!t)
        printf("no Qwen3 tokenizer (%s)\n", err);
    return t;
}

/* in's tokens equal the tokenization of `expect` (with or without the post-processor's specials) */
static void assert_tokens(const struct tok *t, const struct job_input *in, const char *expect,
                          bool add_special)
{
    int32_t *ids;
    size_t n;
    char err[256];
    assert_int_equal(tok_encode_ex(t, expect, strlen(expect), add_special, &ids, &n, err, sizeof err), 0);
    assert_int_equal(in->n_tokens, (int)n);
    assert_memory_equal(in->tokens, ids, n * sizeof(int32_t));
    assert_ptr_equal(in->req.prompt, in->tokens);
    assert_int_equal(in->req.n_prompt, (int)n);
    free(ids);
}

static void test_prepare(void **state)
{
    struct tok *t = qwen3_tok();
    if (!t)
        skip();
    char tdir[4096];
    snprintf(tdir, sizeof tdir, "%s/qwen3-tokenizer", getenv("LLMQ_ASSETS"));
    char cerr[512];
    struct chat_template *ct = chat_template_load(tdir, NULL, cerr, sizeof cerr);
    if (!ct)
        fail_msg("Qwen3's chat template: %s", cerr);
    struct job j;
    struct job_input in;
    char err[512];
    /* a prompt is tokenized as is; its parameters reach the request */
    assert_int_equal(
        parse("{\"prompt\": \"Hello world\", \"max_tokens\": 5, \"temperature\": 0, \"stop\": [\"x\"], "
              "\"stop_token_ids\": [3], \"seed\": 11, \"min_tokens\": 2, \"ignore_eos\": true, "
              "\"logprobs\": 3, \"skip_special_tokens\": false, \"priority\": 3, \"timeout_s\": 9}",
              &j, err, sizeof err),
        JOB_OK);
    assert_int_equal(job_prepare(&j, t, ct, 4096, &in, err, sizeof err), JOB_OK);
    assert_tokens(t, &in, "Hello world", true);
    assert_int_equal(in.req.max_tokens, 5);
    assert_int_equal(in.req.min_tokens, 2);
    assert_true(in.req.ignore_eos);
    assert_int_equal(in.req.n_stop, 1);
    assert_string_equal(in.req.stop[0], "x");
    assert_int_equal(in.req.n_stop_ids, 1);
    assert_true(in.req.has_seed);
    assert_true(in.req.sp.seed == 11);
    assert_int_equal(in.req.sp.logprobs, 3);
    assert_float_equal(in.req.sp.temperature, 0, 0);
    assert_false(in.req.skip_special_tokens);
    assert_int_equal(in.req.priority, 3);
    assert_true(in.req.deadline == 0); /* the caller's: job_deadline */
    job_input_free(&in);
    job_free(&j);

    /* messages go through the model's own template, with and without thinking */
    const char *chat = "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}";
    assert_int_equal(parse(chat, &j, err, sizeof err), JOB_OK);
    assert_int_equal(job_prepare(&j, t, ct, 4096, &in, err, sizeof err), JOB_OK);
    assert_tokens(t, &in, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", false);
    job_input_free(&in);
    j.enable_thinking = false;
    assert_int_equal(job_prepare(&j, t, ct, 4096, &in, err, sizeof err), JOB_OK);
    assert_tokens(t, &in, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
                  false);
    job_input_free(&in);
    job_free(&j);

    /* a template's raise_exception fails the job with its message; no template, the same code */
    char tmp[] = "/tmp/llmq-test-job-XXXXXX", path[4200];
    assert_non_null(mkdtemp(tmp));
    snprintf(path, sizeof path, "%s/raise.jinja", tmp);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{{ raise_exception('no ' ~ messages[0].role ~ ' here') }}", f);
    fclose(f);
    struct chat_template *raising = chat_template_load(tdir, path, cerr, sizeof cerr);
    struct chat_template *none = chat_template_load(tmp, NULL, cerr, sizeof cerr);
    assert_non_null(raising);
    assert_non_null(none);
    assert_false(chat_template_present(none));
    assert_int_equal(parse(chat, &j, err, sizeof err), JOB_OK);
    assert_int_equal(job_prepare(&j, t, raising, 4096, &in, err, sizeof err), JOB_ERR_TEMPLATE);
    assert_string_equal(err, "no user here");
    job_input_free(&in);
    assert_int_equal(job_prepare(&j, t, none, 4096, &in, err, sizeof err), JOB_ERR_TEMPLATE);
    assert_non_null(strstr(err, "the model has no chat template"));
    job_input_free(&in);
    job_free(&j);
    assert_int_equal(parse("{\"prompt\": \"Hello world\"}", &j, err, sizeof err), JOB_OK);
    assert_int_equal(job_prepare(&j, t, none, 4096, &in, err, sizeof err), JOB_OK); /* prompts still run */
    job_input_free(&in);
    job_free(&j);
    chat_template_free(raising);
    chat_template_free(none);
    unlink(path);
    rmdir(tmp);

    /* token-id prompts pass through */
    const char *ids =
        "{\"custom_id\": \"c\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": [9707, 1879]}}";
    assert_int_equal(parse(ids, &j, err, sizeof err), JOB_OK);
    assert_int_equal(job_prepare(&j, t, ct, 4096, &in, err, sizeof err), JOB_OK);
    assert_int_equal(in.n_tokens, 2);
    assert_int_equal(in.tokens[1], 1879);
    job_input_free(&in);
    job_free(&j);

    /* max_model_len: a prompt that fills it fails; an explicit max_tokens over it fails; a default
     * one is clamped to what fits */
    int32_t *hw;
    size_t n_hw;
    assert_int_equal(tok_encode(t, "Hello world", 11, &hw, &n_hw, err, sizeof err), 0);
    free(hw);
    assert_int_equal(parse("{\"prompt\": \"Hello world\"}", &j, err, sizeof err), JOB_OK);
    assert_int_equal(job_prepare(&j, t, ct, (int)n_hw, &in, err, sizeof err), JOB_ERR_CONTEXT);
    assert_non_null(strstr(err, "max_model_len"));
    job_input_free(&in);
    assert_int_equal(job_prepare(&j, t, ct, (int)n_hw + 3, &in, err, sizeof err), JOB_OK);
    assert_int_equal(in.req.max_tokens, 3); /* default 256, clamped */
    job_input_free(&in);
    job_free(&j);
    assert_int_equal(parse("{\"prompt\": \"Hello world\", \"max_tokens\": 4}", &j, err, sizeof err), JOB_OK);
    assert_int_equal(job_prepare(&j, t, ct, (int)n_hw + 4, &in, err, sizeof err), JOB_OK);
    job_input_free(&in);
    assert_int_equal(job_prepare(&j, t, ct, (int)n_hw + 3, &in, err, sizeof err), JOB_ERR_CONTEXT);
    assert_non_null(strstr(err, "max_tokens is 4"));
    assert_non_null(strstr(err, "at most 3 tokens can be generated"));
    job_input_free(&in);
    job_free(&j);

    /* a thinking budget and stop_in_reasoning reach the request; completions keep the think block in
     * their text, chat and llmq jobs split it */
    assert_int_equal(
        parse("{\"prompt\": \"<think>\\n\", \"thinking_budget\": 0, \"stop_in_reasoning\": true}", &j, err,
              sizeof err),
        JOB_OK);
    assert_int_equal(job_prepare(&j, t, ct, 4096, &in, err, sizeof err), JOB_OK);
    assert_true(in.req.has_thinking_budget);
    assert_int_equal(in.req.thinking_budget, 0);
    assert_true(in.req.stop_in_reasoning);
    assert_false(in.req.no_think_split);
    job_input_free(&in);
    job_free(&j);
    assert_int_equal(parse("{\"custom_id\": \"c\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": "
                           "\"x\", \"thinking_budget\": 7}}",
                           &j, err, sizeof err),
                     JOB_OK);
    assert_int_equal(job_prepare(&j, t, ct, 4096, &in, err, sizeof err), JOB_OK);
    assert_true(in.req.has_thinking_budget);
    assert_int_equal(in.req.thinking_budget, 7);
    assert_true(in.req.no_think_split);
    job_input_free(&in);
    job_free(&j);
    assert_int_equal(parse("{\"prompt\": \"x\"}", &j, err, sizeof err), JOB_OK);
    assert_int_equal(job_prepare(&j, t, ct, 4096, &in, err, sizeof err), JOB_OK);
    assert_false(in.req.has_thinking_budget);
    assert_false(in.req.stop_in_reasoning);
    job_input_free(&in);
    job_free(&j);
    tok_free(t);
    chat_template_free(ct);
}

/* After the engine has the tokens the input goes; what the row and result need stays, and the
 * metadata can be read again from the text (llmq's form and an OpenAI body alike). */
static void test_drop_input_and_metadata_of(void **state)
{
    (void)state;
    const char *chat = "{\"id\": \"c\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
                       "\"enable_thinking\": false, \"metadata\": {\"k\": [1, \"two\"]}}";
    struct job j;
    char err[256];
    assert_int_equal(parse(chat, &j, err, sizeof err), JOB_OK);
    assert_non_null(j.messages);
    job_drop_input(&j);
    assert_null(j.messages);
    assert_null(j.tools);
    assert_null(j.prompt);
    assert_string_equal(j.id, "c");
    json_t *p = job_params_json(&j);
    assert_true(json_is_false(json_object_get(p, "enable_thinking"))); /* still a chat job's params */
    json_decref(p);
    json_t *m = job_metadata_of(chat, strlen(chat));
    assert_true(json_equal(m, j.metadata));
    json_decref(m);
    job_free(&j);
    const char *oa = "{\"custom_id\": \"r\", \"method\": \"POST\", \"url\": \"/v1/completions\", "
                     "\"body\": {\"prompt\": \"p\", \"metadata\": {\"x\": 1}}}";
    m = job_metadata_of(oa, strlen(oa));
    assert_int_equal(json_integer_value(json_object_get(m, "x")), 1);
    json_decref(m);
    assert_null(job_metadata_of("{\"prompt\": \"p\"}", 15));
    assert_null(job_metadata_of("not json", 8));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_lines),
        cmocka_unit_test(test_failed_line_keeps_form_and_id),
        cmocka_unit_test(test_size_and_depth_limits),
        cmocka_unit_test(test_llmq_all_fields),
        cmocka_unit_test(test_llmq_value_forms),
        cmocka_unit_test(test_llmq_messages),
        cmocka_unit_test(test_templates),
        cmocka_unit_test(test_summarize_fields),
        cmocka_unit_test(test_openai_chat),
        cmocka_unit_test(test_openai_completion),
        cmocka_unit_test(test_defaults_precedence),
        cmocka_unit_test(test_ids),
        cmocka_unit_test(test_scheduling_fields),
        cmocka_unit_test(test_error_codes),
        cmocka_unit_test(test_constraint_json_schema),
        cmocka_unit_test(test_constraint_other_kinds),
        cmocka_unit_test(test_constraint_errors),
        cmocka_unit_test(test_prepare),
        cmocka_unit_test(test_drop_input_and_metadata_of),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
