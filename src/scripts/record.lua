-- record.lua — read one request record, wherever it is kept (read only).
-- (prelude.lua is prepended.)
--
-- A request record is a key of its own, or — a sale applied wholly at its home segment — a
-- compact entry in its segment's window hashes (see the prelude's `record`). This reads
-- either as the fields of a full record, so the engine's replay answers need not know which.
--
-- Stored letters and fields: the tables in src/store/redis/lua.rs (rustdoc: shardstock::store::redis::lua).
--
-- KEYS[1]  request record <prefix>:{<sku>#<i>}:g<gen>:rq:<request id>
-- KEYS[2]  the segment hash (same tag; read by nothing here). Declared so that while Redis
--          Cluster moves the slot, a call meets TRYAGAIN (keys split between the nodes) instead
--          of running on the importing node, where window keys not yet moved read as missing.
--
-- Reply: the record's fields and values, flattened like HGETALL (empty: no record).
local rec = record(KEYS[1])
local flat = {}
if rec then
  for k, v in pairs(rec) do
    flat[#flat + 1] = k
    flat[#flat + 1] = v
  end
end
return flat
