"""The JavaScript every JavaScript handler's context runs before the handler: Couchbase's globals (bucket
maps, `couchbase.*`, timers, `curl`, `log`, the built-in functions) written over `__host`, the Python
object of eventing.execution.javascript that reaches the function's real bindings.

Values cross as JSON text, a binary document (an ArrayBuffer) as `{"\u0000binary": [its bytes]}` (`__doc`,
`__docOf`). `__batch` runs OnUpdate (and OnDelete) over a run of mutations (JsOnUpdate.batch), `__idx` being
the one in progress; it returns how many returned, or -1 - i when mutation i threw. A host call that failed
returns its error as text starting with NUL (JSON text never does), which `__r` throws as an Error, so a
handler's try/catch sees binding errors as in Couchbase. `log` writes each argument as JSON.stringify does (an
Error as its toString()), separated by spaces, as Couchbase's log does. OnUpdate gets a third argument as in
Couchbase 7.6 (`OnUpdate(doc, meta, xattrs)`): the document's user extended attributes as of the mutation,
`{}` when it has none (the fast paths `__update` and `__batch` take only such mutations). The built-ins check
their arguments as Couchbase's C++ does and throw its EventingError; they, log, curl and the timers are on
`couchbase` too.
"""

PRELUDE = r"""
'use strict';
var __in = null;
// The host's methods, looked up once: a call through the host object costs ~6 us in STPyV8 (a named lookup on
// the Python object each time), a call of the method held here ~1 us.
var __hostFn = {get: __host.get, set: __host.set, remove: __host.remove, op: __host.op, log: __host.log,
                create_timer: __host.create_timer, cancel_timer: __host.cancel_timer, curl: __host.curl,
                builtin: __host.builtin, key: __host.key};
function __r(s) {
  if (typeof s === 'string' && s.charCodeAt(0) === 0) { throw new Error(s.slice(1)); }
  return s;
}
function __j(s) { s = __r(s); return (s === null || s === undefined) ? undefined : JSON.parse(s); }
function __text(v) { return JSON.stringify(v === undefined ? null : v); }
// Documents: an ArrayBuffer is a binary document, sent and received as {"\u0000binary": [its bytes]}; any
// other value is JSON (an object, or a string, number, array ... Couchbase keeps as a JSON document).
var __BIN = '\u0000binary';
function __doc(v) {
  if (v instanceof ArrayBuffer) { var o = {}; o[__BIN] = Array.from(new Uint8Array(v)); return JSON.stringify(o); }
  return __text(v);
}
function __docOf(v) {
  if (v !== null && typeof v === 'object' && !Array.isArray(v) && __BIN in v) { return new Uint8Array(v[__BIN]).buffer; }
  return v;
}
var __aliases = new WeakMap();
function __bucketMap(alias) {
  var map = new Proxy(Object.create(null), {
    get: function (t, key) {
      if (typeof key !== 'string') { return undefined; }
      if (key === 'toJSON' || key === 'then') { return undefined; }
      return __docOf(__j(__hostFn.get(alias, key)));
    },
    set: function (t, key, value) { __r(__hostFn.set(alias, String(key), __doc(value))); return true; },
    deleteProperty: function (t, key) { __r(__hostFn.remove(alias, String(key))); return true; },
    has: function (t, key) { return typeof key === 'string' && __j(__hostFn.get(alias, key)) !== undefined; },
    ownKeys: function () { return []; }
  });
  __aliases.set(map, alias);
  return map;
}
function __urlBinding(alias) { return Object.freeze({__url_binding: alias}); }
function __id(meta) {
  if (meta === null || typeof meta !== 'object' || meta.id === undefined) {
    throw new Error('pass the document meta as an object with id, for example {"id": key}');
  }
  return String(meta.id);
}
function __alias(binding) {
  var alias = (binding !== null && typeof binding === 'object') ? __aliases.get(binding) : undefined;
  if (alias === undefined) { throw new Error('the first argument is not a bucket binding; pass the binding alias'); }
  return alias;
}
function __expiry(meta) {
  if (meta && meta.expiry_date instanceof Date) { return meta.expiry_date.getTime() / 1000; }
  if (meta && typeof meta.expiry_date === 'number') { return meta.expiry_date; }
  return 0;
}
function __op(name, binding, meta, doc, extra) {
  var cas = (meta && meta.cas !== undefined) ? String(meta.cas) : null;
  var res = __j(__hostFn.op(name, __alias(binding), __id(meta), cas, __expiry(meta), __doc(doc), __text(extra),
                          __text(meta.keyspace)));
  if (res.meta && res.meta.expiry_date) { res.meta.expiry_date = new Date(res.meta.expiry_date * 1000); }
  if (res.doc !== undefined) { res.doc = __docOf(res.doc); }
  return res;
}
// A spec's options ({xattrs: true}: a path of the document's user XATTRs) go with it as Couchbase's do.
function __lspec(op) { return function (path, options) { return {op: op, path: path, options: options}; }; }
function __spec(op) {
  return function (path, value, options) { return {op: op, path: path, value: value, options: options}; };
}
var couchbase = {
  get: function (b, meta, options) { return __op('get', b, meta, null, null); },
  insert: function (b, meta, doc) { return __op('insert', b, meta, doc, null); },
  upsert: function (b, meta, doc) { return __op('upsert', b, meta, doc, null); },
  replace: function (b, meta, doc) { return __op('replace', b, meta, doc, null); },
  delete: function (b, meta) { return __op('delete', b, meta, null, null); },
  increment: function (b, meta) { return __op('increment', b, meta, null, null); },
  decrement: function (b, meta) { return __op('decrement', b, meta, null, null); },
  touch: function (b, meta) { return __op('touch', b, meta, null, null); },
  lookupIn: function (b, meta, specs) { return __op('lookupIn', b, meta, null, specs); },
  mutateIn: function (b, meta, specs) { return __op('mutateIn', b, meta, null, specs); },
  LookupInSpec: Object.freeze({get: __lspec('get'), exists: __lspec('exists')}),
  MutateInSpec: Object.freeze({
    insert: __spec('insert'), upsert: __spec('upsert'), replace: __spec('replace'),
    remove: __lspec('remove'), arrayAppend: __spec('array_append'), arrayPrepend: __spec('array_prepend'),
    arrayInsert: __spec('array_insert'), arrayAddUnique: __spec('array_add_unique')
  })
};
function log() {
  var parts = [];
  for (var i = 0; i < arguments.length; i++) {
    var a = arguments[i], text;
    try { text = JSON.stringify(a instanceof Error ? a.toString() : a); } catch (e) { text = ''; }
    parts.push(text === undefined ? 'undefined' : text);
  }
  __r(__hostFn.log(parts.join(' ')));
}
function __callbackName(callback, what) {
  if (typeof callback !== 'function' || !callback.name || globalThis[callback.name] !== callback) {
    throw new Error(what + ': the callback must be a top-level function of the handler, for example ' +
                    what + '(OnTimer, ...)');
  }
  return callback.name;
}
function createTimer(callback, date, reference, context) {
  var name = __callbackName(callback, 'createTimer');
  if (!(date instanceof Date) || isNaN(date.getTime())) {
    throw new Error('createTimer: the date is not a Date; pass new Date(...)');
  }
  var ref = (reference === undefined || reference === null) ? null : String(reference);
  return __r(__hostFn.create_timer(name, date.getTime() / 1000, ref, __text(context)));
}
function cancelTimer(callback, reference) {
  return __j(__hostFn.cancel_timer(__callbackName(callback, 'cancelTimer'), String(reference)));
}
function curl(method, binding, request) {
  if (binding === null || typeof binding !== 'object' || binding.__url_binding === undefined) {
    throw new Error('curl: the second argument is not a URL binding; pass the URL binding alias');
  }
  var res = __j(__hostFn.curl(String(method), binding.__url_binding, __text(request === undefined ? {} : request)));
  res.body = __docOf(res.body);  // a body that is not text is an ArrayBuffer, as in Couchbase
  return res;
}
// Couchbase's error types: EventingError is what its built-in functions throw.
function __errorType(name) {
  var T = function (message) {
    if (!(this instanceof T)) { return new T(message); }
    var e = new Error(message);
    Object.defineProperty(this, 'message', {value: e.message, writable: true, configurable: true});
    Object.defineProperty(this, 'stack', {value: e.stack, writable: true, configurable: true});
  };
  T.prototype = Object.create(Error.prototype, {constructor: {value: T, writable: true, configurable: true}});
  T.prototype.name = name;
  Object.defineProperty(T, 'name', {value: name});
  return T;
}
var EventingError = __errorType('EventingError'), KVError = __errorType('KVError'),
    N1QLError = __errorType('N1QLError'), CurlError = __errorType('CurlError');
function __one(args) { if (args.length !== 1) { throw new EventingError('Need exactly one argument'); } }
// The text a built-in hashes or encodes: a string as it is (crc_64_go_iso, base64Encode) or JSON.stringify's
// text, which is "undefined" for undefined, a function or a Symbol (as Couchbase's C++ reads it); BigInt
// throws JSON.stringify's TypeError. An ArrayBuffer's bytes go as they are (crc64, crc_64_go_iso).
function __bytesOf(v, rawString) {
  if (v instanceof ArrayBuffer) { var o = {}; o[__BIN] = Array.from(new Uint8Array(v)); return o; }
  if (rawString && typeof v === 'string') { return v; }
  var t = JSON.stringify(v);
  return t === undefined ? 'undefined' : t;
}
function crc64(value) { __one(arguments); return __r(__hostFn.builtin('crc64', JSON.stringify(__bytesOf(value, false)))); }
function crc_64_go_iso(value) {
  __one(arguments); return __r(__hostFn.builtin('crc_64_go_iso', JSON.stringify(__bytesOf(value, true))));
}
function base64Encode(value) {
  __one(arguments);
  var text = (typeof value === 'string') ? value : __bytesOf(value instanceof ArrayBuffer ? {} : value, false);
  return __r(__hostFn.builtin('base64_encode', JSON.stringify(text)));
}
function base64Decode(value) {
  __one(arguments);
  if (typeof value !== 'string') { throw new EventingError('Argument must be of type String'); }
  var out = __j(__hostFn.builtin('base64_decode', JSON.stringify(value)));
  if (out === null) { throw new EventingError('Invalid input'); }
  return out;
}
function __floats(a) {
  if (!Array.isArray(a)) { throw new EventingError('Argument must be of type Array'); }
  for (var i = 0; i < a.length; i++) {
    if (typeof a[i] !== 'number') { throw new EventingError('Array elements should be of type Number'); }
  }
  return JSON.stringify(a.map(function (x) { return isFinite(x) ? x : String(x); }));
}
function __floatsOf(kind, s) {
  if (typeof s !== 'string') { throw new EventingError('Argument must be of type String'); }
  var out = __j(__hostFn.builtin(kind, JSON.stringify(s)));
  if (typeof out === 'string') { throw new EventingError(out); }
  return out.map(function (x) { return typeof x === 'string' ? Number(x) : x; });
}
function base64Float32ArrayEncode(a) { __one(arguments); return __r(__hostFn.builtin('f32_encode', __floats(a))); }
function base64Float32ArrayDecode(s) { __one(arguments); return __floatsOf('f32_decode', s); }
function base64Float64ArrayEncode(a) { __one(arguments); return __r(__hostFn.builtin('f64_encode', __floats(a))); }
function base64Float64ArrayDecode(s) { __one(arguments); return __floatsOf('f64_decode', s); }
function N1QL() { throw new Error('SQL++ (N1QL) is not supported; read and write documents through bucket bindings'); }
// What Couchbase also puts on `couchbase` (v8worker2.cc): the built-ins, log, curl and the timers.
Object.assign(couchbase, {
  crc64: crc64, crc_64_go_iso: crc_64_go_iso, base64Encode: base64Encode, base64Decode: base64Decode,
  base64Float32ArrayEncode: base64Float32ArrayEncode, base64Float32ArrayDecode: base64Float32ArrayDecode,
  base64Float64ArrayEncode: base64Float64ArrayEncode, base64Float64ArrayDecode: base64Float64ArrayDecode,
  log: log, curl: curl, createTimer: createTimer, cancelTimer: cancelTimer, n1qlQuery: N1QL,
  analyticsQuery: function () { throw new Error('Analytics is not supported'); }
});
Object.freeze(couchbase);
var __err = null;
var __stringify = JSON.stringify, __string = String, __tag = Object.prototype.toString;
function __describe(e) {
  // [message, stack] of any thrown value, as plain strings; never throws: a handler may throw a cyclic
  // object, a Symbol, or a Proxy whose every trap throws.
  try {
    if (e instanceof Error) {
      return [__string(e.name) + ': ' + __string(e.message), __string(e.stack || '')];
    }
  } catch (x) {}
  try {
    if (typeof e === 'string') { return ['Uncaught ' + e, '']; }
    if (typeof e === 'symbol') { return ['Uncaught ' + e.toString(), '']; }
    if (typeof e === 'bigint') { return ['Uncaught ' + __string(e) + 'n', '']; }
  } catch (x) {}
  var why = '';
  try {
    var text = __stringify(e);
    return ['Uncaught ' + (text === undefined ? __string(e) : text), ''];
  } catch (x) {
    try { why = ' (' + __string(x.message).replace(/\s+/g, ' ') + ')'; } catch (y) {}
  }
  try { return ['Uncaught ' + __tag.call(e) + why, '']; } catch (x) {}
  return ['Uncaught a value whose properties cannot be read (a Proxy whose traps throw)', ''];
}
function __fail(e) {
  __err = __stringify(__describe(e));
  return 1;
}
// meta.idempotency_key: asked of the host when read (eventing.core.idempotency), not made for every call.
function __idemKey() { return __r(__hostFn.key(this.vb, this.seq)); }
function __keyed(meta) {
  if (meta !== null && typeof meta === 'object' && typeof meta.seq === 'number') {
    Object.defineProperty(meta, 'idempotency_key', {get: __idemKey, enumerable: false, configurable: true});
  }
  return meta;
}
function __call() {
  var a = JSON.parse(__in);
  if (a[0] === 'OnUpdate') { a[1] = __docOf(a[1]); if (a.length === 3) { a.push({}); } __keyed(a[2]); }
  else if (a[0] === 'OnDelete') { __keyed(a[1]); }
  try { globalThis[a[0]].apply(null, a.slice(1)); return 0; } catch (e) { return __fail(e); }
}
function __update() {
  var a = JSON.parse(__in);
  try { OnUpdate(a[0], __keyed(a[1]), {}); return 0; } catch (e) { return __fail(e); }
}
var __idx = 0;
function __batch() {
  var a = JSON.parse(__in);
  var docs = a[0], ids = a[1], cas = a[2], exp = a[3], flags = a[4], seqs = a[5], vb = a[6], ks = a[7];
  var n = docs.length, stop = Date.now() + a[8], binary = a[9], ops = a[10];  // ops: null when all are updates
  for (__idx = 0; __idx < n; __idx++) {
    if (__idx > 0 && Date.now() >= stop) { return __idx; }
    var doc = docs[__idx], meta = {cas: cas[__idx], id: ids[__idx], expiration: exp[__idx], flags: flags[__idx], vb: vb,
                                   seq: seqs[__idx], datatype: 'json', keyspace: Object.assign({}, ks)};
    var op = ops === null ? 0 : ops[__idx];
    if (op !== 0) {  // a deletion (1) or an expiry (2)
      try { OnDelete(__keyed(meta), {expired: op === 2}); } catch (e) { __fail(e); return -1 - __idx; }
      continue;
    }
    if (binary) { var bin = __docOf(doc); if (bin !== doc) { doc = bin; meta.datatype = 'binary'; } }
    try { OnUpdate(doc, __keyed(meta), {}); } catch (e) { __fail(e); return -1 - __idx; }
  }
  return n;
}
"""  # noqa: E501
