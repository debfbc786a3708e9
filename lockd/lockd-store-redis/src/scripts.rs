//! The Lua scripts lockd runs in Redis. A script runs atomically, and is replicated as its
//! effects in one transaction.

/// Takes the leader key if nobody holds it, and raises the stored epoch to the term's.
/// KEYS: leader, epoch. ARGV: the leader value, Sentinel's configuration epoch, the TTL in
/// ms, the highest epoch there can be ([`crate::MAX_EPOCH`]; a stored epoch that is not a
/// whole number up to it is an error, naming the key). Returns `{1, term epoch}` (the higher of Sentinel's and the stored one), or
/// `{0, the holder's value}`.
pub const CAMPAIGN: &str = r"
local stored = redis.call('GET', KEYS[2])
if stored then
  local n = tonumber(stored)
  if not n or n < 0 or n > tonumber(ARGV[4]) or n ~= math.floor(n) then
    return redis.error_reply('ERR lockd: ' .. KEYS[2] .. ' holds ' .. string.format('%q', string.sub(stored, 1, 40)) .. ', not an epoch (a whole number from 0 to ' .. ARGV[4] .. '); lockd writes it, never edit it: set it back, or delete it if the tokens it guarded are gone')
  end
  stored = n
else
  stored = 0
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[3]) then
  local epoch = tonumber(ARGV[2])
  if stored > epoch then epoch = stored end
  redis.call('SET', KEYS[2], string.format('%d', epoch))
  return {1, string.format('%d', epoch)}
end
return {0, redis.call('GET', KEYS[1]) or ''}
";

/// Extends the leader key while it holds this term's value. KEYS: leader. ARGV: the value,
/// the TTL in ms. Returns 1, or 0 if the key is not this term's.
pub const RENEW: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
";

/// Deletes the leader key if it holds this term's value. KEYS: leader. ARGV: the value.
pub const RESIGN: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// One batch: changes nothing unless the leader key holds this term's value (else returns
/// 0) and the batch key the previous batch's id (else -1), and the keys have the types lockd
/// gives them (else an error); then applies every change and sets the batch key to this
/// batch's id (returns 1).
///
/// KEYS: leader, batch, locks, requests, high-water. ARGV: the leader value, the previous
/// batch's id (`""`: none), this batch's id, then one triple per change: `L`/`l` (put/delete
/// a lock record), `R`/`r` (put/delete a request record) or `H` (set the high-water), the
/// field, the value.
pub const COMMIT: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if (redis.call('GET', KEYS[2]) or '') ~= ARGV[2] then return -1 end
for k = 3, 4 do
  local t = redis.call('TYPE', KEYS[k]).ok
  if t ~= 'hash' and t ~= 'none' then
    return redis.error_reply('ERR lockd: ' .. KEYS[k] .. ' is a ' .. t .. ', not a hash')
  end
end
local t = redis.call('TYPE', KEYS[5]).ok
if t ~= 'string' and t ~= 'none' then
  return redis.error_reply('ERR lockd: ' .. KEYS[5] .. ' is a ' .. t .. ', not a string')
end
for i = 4, #ARGV, 3 do
  local op = ARGV[i]
  if not (op == 'L' or op == 'l' or op == 'R' or op == 'r' or op == 'H') or ARGV[i + 2] == nil then
    return redis.error_reply('ERR lockd: a malformed change at argument ' .. i)
  end
end
for i = 4, #ARGV, 3 do
  local op, field, value = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if op == 'L' then redis.call('HSET', KEYS[3], field, value)
  elseif op == 'l' then redis.call('HDEL', KEYS[3], field)
  elseif op == 'R' then redis.call('HSET', KEYS[4], field, value)
  elseif op == 'r' then redis.call('HDEL', KEYS[4], field)
  else redis.call('SET', KEYS[5], value) end
end
redis.call('SET', KEYS[2], ARGV[3])
return 1
";
