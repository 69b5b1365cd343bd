"""The JavaScript every JavaScript handler's context runs before the handler: Couchbase's globals (bucket
maps, `couchbase.*`, timers, `curl`, `log`, the built-in functions) written over `__host`, the Python
object of eventing.execution.javascript that reaches the function's real bindings.

Values cross as JSON text, a binary document (an ArrayBuffer) as `{"\u0000binary": [its bytes]}` (`__doc`,
`__docOf`). `__batch` runs OnUpdate over a run of mutations (JsOnUpdate.batch), `__idx` being the one in
progress; it returns how many returned, or -1 - i when mutation i threw. A host call that failed returns its
error as text starting with NUL (JSON text never does), which `__r` throws as an Error, so a handler's
try/catch sees binding errors as in Couchbase. `log` writes each argument as JSON.stringify does (an Error
as its toString()), separated by spaces, as Couchbase's log does.
"""

PRELUDE = r"""
'use strict';
var __in = null;
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
      return __docOf(__j(__host.get(alias, key)));
    },
    set: function (t, key, value) { __r(__host.set(alias, String(key), __doc(value))); return true; },
    deleteProperty: function (t, key) { __r(__host.remove(alias, String(key))); return true; },
    has: function (t, key) { return typeof key === 'string' && __j(__host.get(alias, key)) !== undefined; },
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
  var res = __j(__host.op(name, __alias(binding), __id(meta), cas, __expiry(meta), __doc(doc), __text(extra),
                          __text(meta.keyspace)));
  if (res.meta && res.meta.expiry_date) { res.meta.expiry_date = new Date(res.meta.expiry_date * 1000); }
  if (res.doc !== undefined) { res.doc = __docOf(res.doc); }
  return res;
}
function __spec(op) { return function (path, value) { return {op: op, path: path, value: value}; }; }
var couchbase = Object.freeze({
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
  LookupInSpec: Object.freeze({get: __spec('get'), exists: __spec('exists')}),
  MutateInSpec: Object.freeze({
    insert: __spec('insert'), upsert: __spec('upsert'), replace: __spec('replace'),
    remove: __spec('remove'), arrayAppend: __spec('array_append')
  })
});
function log() {
  var parts = [];
  for (var i = 0; i < arguments.length; i++) {
    var a = arguments[i], text;
    try { text = JSON.stringify(a instanceof Error ? a.toString() : a); } catch (e) { text = ''; }
    parts.push(text === undefined ? 'undefined' : text);
  }
  __r(__host.log(parts.join(' ')));
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
  return __r(__host.create_timer(name, date.getTime() / 1000, ref, __text(context)));
}
function cancelTimer(callback, reference) {
  return __j(__host.cancel_timer(__callbackName(callback, 'cancelTimer'), String(reference)));
}
function curl(method, binding, request) {
  if (binding === null || typeof binding !== 'object' || binding.__url_binding === undefined) {
    throw new Error('curl: the second argument is not a URL binding; pass the URL binding alias');
  }
  var res = __j(__host.curl(String(method), binding.__url_binding, __text(request === undefined ? {} : request)));
  res.body = __docOf(res.body);  // a body that is not text is an ArrayBuffer, as in Couchbase
  return res;
}
function crc64(value) { return __r(__host.builtin('crc64', __text(value))); }
function crc_64_go_iso(value) { return __r(__host.builtin('crc_64_go_iso', __text(value))); }
function base64Encode(value) { return __r(__host.builtin('base64_encode', __text(value))); }
function base64Decode(value) { return __r(__host.builtin('base64_decode', __text(value))); }
function base64Float32ArrayEncode(a) { return __r(__host.builtin('f32_encode', __text(Array.from(a)))); }
function base64Float32ArrayDecode(s) { return __j(__host.builtin('f32_decode', __text(s))); }
function base64Float64ArrayEncode(a) { return __r(__host.builtin('f64_encode', __text(Array.from(a)))); }
function base64Float64ArrayDecode(s) { return __j(__host.builtin('f64_decode', __text(s))); }
function N1QL() { throw new Error('SQL++ (N1QL) is not supported; read and write documents through bucket bindings'); }
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
function __call() {
  var a = JSON.parse(__in);
  if (a[0] === 'OnUpdate') { a[1] = __docOf(a[1]); }
  try { globalThis[a[0]].apply(null, a.slice(1)); return 0; } catch (e) { return __fail(e); }
}
function __update() {
  var a = JSON.parse(__in);
  try { OnUpdate(a[0], a[1]); return 0; } catch (e) { return __fail(e); }
}
var __idx = 0;
function __batch() {
  var a = JSON.parse(__in);
  var docs = a[0], ids = a[1], cas = a[2], exp = a[3], flags = a[4], seqs = a[5], vb = a[6], ks = a[7];
  var n = docs.length, stop = Date.now() + a[8], binary = a[9];
  for (__idx = 0; __idx < n; __idx++) {
    if (__idx > 0 && Date.now() >= stop) { return __idx; }
    var doc = docs[__idx], meta = {cas: cas[__idx], id: ids[__idx], expiration: exp[__idx], flags: flags[__idx], vb: vb,
                                   seq: seqs[__idx], datatype: 'json', keyspace: Object.assign({}, ks)};
    if (binary) { var bin = __docOf(doc); if (bin !== doc) { doc = bin; meta.datatype = 'binary'; } }
    try { OnUpdate(doc, meta); } catch (e) { __fail(e); return -1 - __idx; }
  }
  return n;
}
"""
