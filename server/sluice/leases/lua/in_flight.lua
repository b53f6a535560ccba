-- table.in_flight. Reply: {count, next_expiry_s as a decimal string}.
return {redis.call('ZCARD', key), fmt(next_expiry())}
