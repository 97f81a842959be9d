"""VAE reconstructions of 8 generator pictures: usage recon_sheet.py VAE.pt OUT.png"""
import os, sys, torch, numpy as np
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models as M, export as ex, shapes as S
from PIL import Image
torch.set_num_threads(2)
v=M.AutoencoderKL(ex.VAE_CFG); v.load_state_dict(torch.load(sys.argv[1])['model']); v.eval()
rng=np.random.default_rng(5)
imgs=np.stack([S.render(S.sample_attrs(rng),rng) for _ in range(8)])
x=torch.from_numpy(imgs).permute(0,3,1,2).float()/127.5-1
with torch.no_grad(): r=v.decode(v.encode(x)[0])
r=((r.clamp(-1,1)+1)*127.5).round().byte().permute(0,2,3,1).numpy()
print('mean abs err levels', np.abs(r.astype(float)-imgs).mean())
Image.fromarray(np.concatenate([np.concatenate(list(imgs),1),np.concatenate(list(r),1)],0)).resize((1024,256),Image.NEAREST).save(sys.argv[2])
