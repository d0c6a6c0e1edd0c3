/* unicode: flag/lowercase lookups over the generated range tables, and a
 * strict UTF-8 decoder shared by the tokenizer and the detokeniser. */
#include "unicode.h"

#include "unicode_tables.h"

unsigned tdm_unicode_flags(uint32_t cp)
{
    if (cp < 0x100)
        return tdm_unicode_flags_latin1[cp];
    if (cp > 0x10FFFF)
        return 0;
    /* last range whose start <= cp */
    uint32_t lo = 0, hi = tdm_unicode_flag_ranges_n;
    uint32_t key = (cp << TDM_UNICODE_FLAG_BITS) | ((1u << TDM_UNICODE_FLAG_BITS) - 1);
    while (hi - lo > 1) {
        uint32_t mid = (lo + hi) / 2;
        if (tdm_unicode_flag_ranges[mid] <= key)
            lo = mid;
        else
            hi = mid;
    }
    return tdm_unicode_flag_ranges[lo] & ((1u << TDM_UNICODE_FLAG_BITS) - 1);
}

uint32_t tdm_unicode_tolower(uint32_t cp)
{
    if (cp < 0x80)
        return (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp;
    uint32_t lo = 0, hi = tdm_unicode_lower_n;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (tdm_unicode_lower[mid][0] < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < tdm_unicode_lower_n && tdm_unicode_lower[lo][0] == cp)
        return tdm_unicode_lower[lo][1];
    return cp;
}

/* Valid range of the second byte after lead b (RFC 3629 table 3.7); the
 * others are always 80..BF. Returns the sequence length, 0 for a bad lead. */
static int lead_info(uint8_t b, uint8_t *lo, uint8_t *hi)
{
    *lo = 0x80;
    *hi = 0xBF;
    if (b < 0x80)
        return 1;
    if (b >= 0xC2 && b <= 0xDF)
        return 2;
    if (b >= 0xE0 && b <= 0xEF) {
        if (b == 0xE0)
            *lo = 0xA0;
        else if (b == 0xED)
            *hi = 0x9F;
        return 3;
    }
    if (b >= 0xF0 && b <= 0xF4) {
        if (b == 0xF0)
            *lo = 0x90;
        else if (b == 0xF4)
            *hi = 0x8F;
        return 4;
    }
    return 0;
}

int tdm_utf8_check(const uint8_t *s, size_t len)
{
    uint8_t lo, hi;
    int n = lead_info(s[0], &lo, &hi);
    if (n == 0)
        return 0;
    for (int i = 1; i < n; i++) {
        if ((size_t)i >= len)
            return -1;
        uint8_t c = s[i];
        if (i == 1 ? (c < lo || c > hi) : (c & 0xC0) != 0x80)
            return 0;
    }
    return n;
}

size_t tdm_utf8_decode(const uint8_t *s, size_t len, uint32_t *cp)
{
    if (s[0] < 0x80) {
        *cp = s[0];
        return 1;
    }
    int n = tdm_utf8_check(s, len);
    if (n <= 0) {
        *cp = TDM_UNICODE_REPLACEMENT;
        return 1;
    }
    uint32_t c = s[0] & (0x7F >> n);
    for (int i = 1; i < n; i++)
        c = (c << 6) | (s[i] & 0x3F);
    *cp = c;
    return (size_t)n;
}

size_t tdm_utf8_encode(uint32_t cp, uint8_t *out)
{
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | (cp >> 6));
        out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | (cp >> 12));
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | (cp >> 18));
    out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

size_t tdm_utf8_sanitize(const char *s, size_t len, char *out)
{
    const uint8_t *u = (const uint8_t *)s;
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        int n = tdm_utf8_check(u + i, len - i);
        if (n <= 0) {
            out[o++] = (char)0xEF;
            out[o++] = (char)0xBF;
            out[o++] = (char)0xBD;
            i++;
            continue;
        }
        for (int k = 0; k < n; k++)
            out[o++] = s[i + k];
        i += (size_t)n;
    }
    return o;
}
