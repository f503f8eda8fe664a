"""Hard inputs for tokenizer parity tests (shared by several test files)."""

HARD_STRINGS = [
    "Hello, World!",
    "The quick brown fox jumps over the lazy dog.",
    "unaffable tokenization preprocessing Wordpiece",
    # Accents, precomposed and decomposed.
    "Héllo wörld, naïve café, crème brûlée, Ångström, Øresund, façade",
    "ÀÁÂÃÄÅ àáâãäå ÇçÑñ Œœ Ææ Đđ Łł",
    "combining: e\u0301 a\u0308 n\u0303 o\u0302\u0323 \u0301alone x\u0301\u0302\u0303",
    # CJK one by one, kana and hangul as words.
    "中文字符测试 and 日本語のテキスト and 한국어 텍스트",
    "混合mixed中文text，標點。",
    # Control characters, whitespace of all kinds.
    "tab\tnew\nline\rcarriage\x0bvt\x0cff end",
    "null\x00char, bell\x07, escape\x1b[0m, del\x7f, nel\x85x",
    "zero\u200bwidth\u200cnon\u200djoiner\ufeffbom\u2060wj",
    "non\u00a0breaking\u2009thin\u3000ideographic\u202fnarrow\u1680ogham space",
    "soft\u00adhyphen and line\u2028sep and para\u2029sep",
    "RTL mark \u200f and LRM \u200e and bidi \u202aembed\u202c done",
    "\ufffdreplacement\ufffd char",
    # Emoji, symbols, compatibility characters.
    "emoji 😀👍🏽 👨\u200d👩\u200d👧 🇫🇷 ❤\ufe0f ☃ ✓",
    "Straße ß ẞ ™ ℃ № ﬁnance ﬂ ½ ² Ⅻ",
    "ＦＵＬＬ　ｗｉｄｔｈ　１２３ 𝐁𝐨𝐥𝐝 𝔉𝔯𝔞𝔨",
    "İstanbul ǅemal ǈ Ǳ ŉ ſ",
    # Mixed scripts.
    "Ελληνικά κείμενο ΑΘΗΝΑ",
    "Русский текст, Ёлка",
    "עברית טקסט العربية النص",
    "हिन्दी पाठ कि की ภาษาไทย ქართული",
    "Mixed Scripts: Latin Кириллица Ελληνικά 漢字 かな カナ",
    # Punctuation.
    "don't can't o'clock U.S.A. e-mail 3.14 1,000,000 $5 #hashtag @user",
    "http://example.com/a?b=c&d=e~f^g`h|i\\j",
    "¿Qué? ¡Sí! «quotes» „German“ ‘single’ “double” … — – ‐ ·",
    # Long words (the limit is 100 characters after normalisation).
    "a" * 100,
    "b" * 101,
    "ж" * 100 + " " + "ж" * 101,
    "É" * 101,
    "x" + "\u0301" * 150,
    # Empty and whitespace only.
    "",
    " ",
    "   \t\n  ",
    "\u200b",
    "\x00\x01",
    # Special tokens written in text.
    "[MASK] [SEP] [CLS] [UNK] [PAD]",
    "hello[MASK]world [mask] [ MASK ]",
]
