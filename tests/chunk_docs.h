/* Documents for the chunker's tests (header-only; include it after <cmocka.h>): a seeded generator
 * over sentences written for these tests, the same on every platform. */
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/tokenizer.h"
#include "engine/util/buf.h"

static const char *english[] = {
    "The committee met on Tuesday to review the budget for the coming year.",
    "Nobody expected the river to rise so quickly after the storm.",
    "She wrote the report in three days, working mostly at night.",
    "Prices of raw materials doubled, and the factory cut its output by a third.",
    "Why would a careful engineer skip the final inspection?",
    "The tests passed on every machine except the oldest one!",
    "In the end, the bridge was repaired with steel from the old station.",
    "Customers complained about delays; the company promised faster shipping.",
    "He said \"the numbers do not add up.\" Then he left the room.",
    "A small village at the edge of the forest kept its traditions for centuries.",
    "Rainfall this spring was 40% below the ten-year average.",
    "The new policy applies to contracts signed after March 1, 2024.",
    "Each team reported its progress: design, testing, and deployment.",
    "Most of the archive survived the fire, although several maps were lost.",
    "The library extended its opening hours during the examination period.",
    "Engineers measured the vibration at 3.5 Hz, well inside the safe range.",
    "After the merger, two offices closed and one moved to the harbour district.",
    "Was the delay caused by the weather, or by the missing permits?",
    "The orchestra rehearsed the symphony for weeks before the premiere.",
    "Volunteers cleaned the beach (about 2 km of it) in a single afternoon.",
    "Sales in the northern region grew steadily for five consecutive quarters.",
    "The manual describes how to replace the filter without special tools.",
    "Two of the witnesses remembered a blue car parked outside the bank.",
    "Her research focused on how birds navigate across open water.",
    "The council approved the plan, but only after a long debate.",
    "Temperatures dropped below freezing for the first time in November.",
    "A simple checklist prevented most of the errors seen the year before.",
    "The museum's new wing displays tools from the early industrial era.",
    "Several readers wrote in to point out a mistake in the chart.",
    "Everything depends on whether the supplier can deliver on time.",
};

static const char *chinese[] = {
    "委员会在周二开会审议了明年的预算。",
    "暴风雨过后，河水上涨得比预想的快得多。",
    "她用了三天时间写完报告，大部分工作都在夜里完成。",
    "原材料价格翻了一番，工厂把产量削减了三分之一。",
    "为什么一位细心的工程师会跳过最后的检查？",
    "除了最旧的那台机器，测试在所有机器上都通过了！",
    "最后，人们用旧车站拆下的钢材修好了这座桥。",
    "顾客抱怨送货太慢；公司承诺会加快发货。",
    "他说：“这些数字对不上。”然后离开了房间。",
    "森林边上的一个小村庄几百年来一直保留着自己的传统。",
    "今年春天的降雨量比十年平均值低了百分之四十。",
    "新政策适用于三月一日以后签订的合同。",
    "每个小组都汇报了进展：设计、测试和部署。",
    "大部分档案在火灾中保存了下来，虽然丢失了几张地图。",
    "考试期间，图书馆延长了开放时间。",
    "工程师测得的振动频率为三点五赫兹，完全在安全范围之内。",
    "合并之后，两个办事处关闭，另一个搬到了港口区。",
    "延误是天气造成的，还是因为缺少许可证？",
    "首演之前，乐团排练这首交响曲排练了好几个星期。",
    "志愿者们用一个下午清理了大约两公里长的海滩。",
    "北部地区的销售额连续五个季度稳步增长。",
    "手册介绍了不用专门工具就能更换过滤器的方法。",
    "有两名证人记得银行外面停着一辆蓝色的汽车。",
    "她的研究关注鸟类如何在开阔的水面上辨别方向。",
    "议会经过长时间的辩论，终于批准了这项计划。",
    "十一月里气温第一次降到了零度以下。",
    "一份简单的检查清单避免了前一年出现的大部分错误。",
    "博物馆的新展厅展出了工业时代早期的工具。",
    "几位读者来信指出了图表中的一个错误。",
    "一切都取决于供应商能否按时交货。",
};

/* A small deterministic generator, the same on every platform. */
static uint64_t rng_state;
static uint32_t rnd(uint32_t n)
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(rng_state >> 33) % n;
}

static size_t count(const struct tok *tok, const char *s, size_t len)
{
    int32_t *ids;
    size_t n;
    char err[256];
    assert_int_equal(tok_encode_ex(tok, s, len, false, &ids, &n, err, sizeof err), 0);
    free(ids);
    return n;
}

/* Appends a paragraph of 2..8 sentences (sometimes with a line break inside) to b, after a blank
 * line unless b is empty; Chinese sentences are not separated by spaces. */
static void add_paragraph(struct buf *b, bool zh)
{
    const char **src = zh ? chinese : english;
    size_t nsrc = zh ? sizeof chinese / sizeof *chinese : sizeof english / sizeof *english;
    if (b->len)
        assert_int_equal(buf_append(b, "\n\n", 2), 0);
    int k = 2 + (int)rnd(7);
    for (int i = 0; i < k; i++) {
        const char *s = src[rnd((uint32_t)nsrc)];
        if (i > 0 && !zh)
            assert_int_equal(buf_append(b, rnd(6) ? " " : "\n", 1), 0);
        else if (i > 0 && !rnd(6))
            assert_int_equal(buf_append(b, "\n", 1), 0);
        assert_int_equal(buf_append(b, s, strlen(s)), 0);
    }
}

/* Paragraphs from the generator seeded with seed until the text holds at least `tokens` tokens of
 * tok (when tok is not NULL) and at least `bytes` bytes. Returns the text (caller frees), *len its
 * length. */
static char *make_doc(const struct tok *tok, bool zh, size_t tokens, size_t bytes, uint64_t seed, size_t *len)
{
    struct buf b = {0};
    rng_state = seed;
    size_t want = bytes;
    for (;;) {
        while (b.len < want || !b.len)
            add_paragraph(&b, zh);
        size_t n = tok ? count(tok, b.p, b.len) : tokens;
        if (n >= tokens)
            break;
        want = b.len + b.len * (tokens - n) / n + 1; /* the missing tokens at the text's own rate */
    }
    *len = b.len;
    return b.p;
}
